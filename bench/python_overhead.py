"""What calling replayssm from Python costs on top of the kernel (PyTorch CUDA tensors).

For each entry point, at one geometry and batch:
    kernel   per-call GPU time inside a CUDA graph of `--calls` back-to-back calls (no Python);
    eager    per-call wall time of `--calls` eager calls in a row, synchronised at the end;
    issue    per-call host time of those eager calls (before the final synchronisation);
    overhead eager - kernel: what Python adds above the kernel (0 when the GPU is the bottleneck);
    ext      issue time of the extension module called directly (no Python wrapper), for the
             split between the wrapper and the DLPack import.

    python bench/python_overhead.py                 # Nemotron-H layer, batch 1, bf16 / fp32
    python bench/python_overhead.py --batch 1,8 --state-dtype bfloat16
"""

import argparse
import statistics
import time

import torch

import replayssm
from replayssm import _replayssm
from replayssm._streams import launch

BUDGET_US = 10.0


def make_layer(args, batch):
    act = getattr(torch, args.act_dtype)
    H, P, N, G = args.nheads, args.head_dim, args.state_dim, args.ngroups
    layout = replayssm.ReplayCacheLayout(H, P, N, G, args.L, args.act_dtype, args.state_dtype)
    cache = layout.allocate(torch, batch, device="cuda")
    cache.state.normal_()
    return {
        "cache": cache,
        "x": torch.randn(batch, H, P, device="cuda", dtype=act),
        "dt": torch.randn(batch, H, device="cuda", dtype=act),
        "A": -torch.rand(H, device="cuda"),
        "B": torch.randn(batch, G, N, device="cuda", dtype=act),
        "C": torch.randn(batch, G, N, device="cuda", dtype=act),
        "D": torch.randn(H, device="cuda"),
        "z": torch.randn(batch, H, P, device="cuda", dtype=act),
        "dt_bias": torch.randn(H, device="cuda"),
        "indices": torch.arange(batch, dtype=torch.int32, device="cuda"),
        "out": torch.empty(batch, H, P, device="cuda", dtype=act),
    }


def entry_points(t, L):
    """{name: (call through the package, call of the extension module directly)}."""
    c = t["cache"]
    step = (t["x"], t["dt"], t["A"], t["B"], t["C"], t["D"], t["z"], t["dt_bias"], True,
            t["indices"], replayssm.PAD_SLOT_ID, t["out"])
    stream, direct = launch(c.state, None)
    return {
        "selective_state_update": (
            lambda: replayssm.selective_state_update(c.state, *step),
            lambda: _replayssm.selective_state_update(c.state, *step, stream, direct, 0)),
        "replay_decode": (
            lambda: replayssm.replay_decode(c, *step),
            lambda: _replayssm.replay_decode(c.state, c.x_cache, c.B_cache, c.dt_cache,
                                             c.cursors, *step, 0, stream, direct, 0)),
        "replay_advance": (
            lambda: replayssm.replay_advance(c.cursors, L, t["indices"]),
            lambda: _replayssm.replay_advance(c.cursors, L, t["indices"],
                                              replayssm.PAD_SLOT_ID, stream, direct, 0)),
    }


def kernel_us(call, calls, repeats):
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            call()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(repeats):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(samples)


def eager_us(call, calls, repeats):
    """(median wall us per call, median host issue us per call)."""
    walls, issues = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        begin = time.perf_counter()
        for _ in range(calls):
            call()
        issued = time.perf_counter()
        torch.cuda.synchronize()
        done = time.perf_counter()
        walls.append((done - begin) * 1e6 / calls)
        issues.append((issued - begin) * 1e6 / calls)
    return statistics.median(walls), statistics.median(issues)


def export_us(tensor, calls):
    """Per-tensor cost of PyTorch's C-level DLPack export (capsule made and released)."""
    to_dlpack = torch._C._to_dlpack
    begin = time.perf_counter()
    for _ in range(calls):
        to_dlpack(tensor)
    return (time.perf_counter() - begin) * 1e6 / calls


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", default="1", help="comma-separated batch sizes")
    parser.add_argument("--nheads", type=int, default=128)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--state-dim", type=int, default=128)
    parser.add_argument("--ngroups", type=int, default=8)
    parser.add_argument("--L", type=int, default=16)
    parser.add_argument("--act-dtype", default="bfloat16")
    parser.add_argument("--state-dtype", default="float32")
    parser.add_argument("--calls", type=int, default=200, help="calls per graph / eager loop")
    parser.add_argument("--repeats", type=int, default=25)
    args = parser.parse_args()
    if not (torch.cuda.is_available() and replayssm.built_with_cuda()):
        raise SystemExit("bench_overhead needs a GPU visible to torch and a CUDA build of replayssm")

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, replayssm "
          f"{replayssm.__version__}; H={args.nheads} P={args.head_dim} N={args.state_dim} "
          f"G={args.ngroups} L={args.L} act={args.act_dtype} state={args.state_dtype}")
    header = (f"{'batch':>5} {'entry point':<24}{'kernel':>9}{'eager':>9}{'issue':>9}"
              f"{'ext':>9}{'overhead':>10}  (us per call; budget {BUDGET_US:g} us)")
    print(header)
    worst = 0.0
    for batch in (int(b) for b in args.batch.split(",")):
        tensors = make_layer(args, batch)
        for name, (package_call, extension_call) in entry_points(tensors, args.L).items():
            for _ in range(20):
                package_call()
            kernel = kernel_us(package_call, args.calls, args.repeats)
            eager, issue = eager_us(package_call, args.calls, args.repeats)
            _, extension_issue = eager_us(extension_call, args.calls, args.repeats)
            overhead = max(0.0, eager - kernel)
            worst = max(worst, overhead)
            print(f"{batch:>5} {name:<24}{kernel:>9.2f}{eager:>9.2f}{issue:>9.2f}"
                  f"{extension_issue:>9.2f}{overhead:>10.2f}")
    print(f"torch._C._to_dlpack: {export_us(tensors['x'], 20000):.2f} us per tensor")
    print(f"worst overhead {worst:.2f} us: {'within' if worst <= BUDGET_US else 'OVER'} "
          f"the {BUDGET_US:g} us budget; under graph replay Python adds nothing (the graph "
          "holds only the kernels)")


if __name__ == "__main__":
    main()
