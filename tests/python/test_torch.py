"""PyTorch tensors: CPU tensors wherever torch is installed; CUDA tensors (eager, on side
streams, and a CUDA graph of a 32-step decode loop replayed across flushes) where torch sees a
GPU and replayssm was built with CUDA. The oracle is the fp64 recurrence of oracle.py."""

import numpy as np
import pytest

import replayssm
from cases import random_layer, random_state, random_step
from oracle import Mamba2Oracle, relative_error

torch = pytest.importorskip("torch")

HAS_CUDA = torch.cuda.is_available() and replayssm.built_with_cuda()
requires_cuda = pytest.mark.skipif(
    not HAS_CUDA, reason="needs a GPU visible to torch and a CUDA build of replayssm")

TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}
STATE_TOLERANCE = {torch.float32: 2e-5, torch.float16: 5e-3, torch.bfloat16: 4e-2}


def tensor(array, dtype, device):
    return torch.from_numpy(np.ascontiguousarray(array)).to(device=device, dtype=dtype)


class Model:
    """One layer's parameters and a batch whose rows join one step apart (row r is a pad row
    for its first r steps), on one device."""

    def __init__(self, device, act, geometry=(8, 64, 128, 2), batch=4, slots=6, seed=7):
        self.rng = np.random.default_rng(seed)
        self.device, self.act = device, act
        self.H, self.P, self.N, self.G = geometry
        self.batch, self.slots = batch, slots
        layer = random_layer(self.rng, self.H)
        # nn.Parameter (requires_grad): the direct export accepts what __dlpack__ would refuse.
        self.A = torch.nn.Parameter(tensor(layer.A, torch.float32, device))
        self.D = tensor(layer.D, torch.float32, device)
        self.dt_bias = tensor(layer.dt_bias, torch.float32, device)
        self.slot_of_row = self.rng.permutation(slots)[:batch].tolist()

    def indices(self, t):
        rows = [s if r <= t else replayssm.PAD_SLOT_ID for r, s in enumerate(self.slot_of_row)]
        return torch.tensor(rows, dtype=torch.int32, device=self.device)

    def oracle_slots(self, t):
        return [s if r <= t else None for r, s in enumerate(self.slot_of_row)]

    def active(self, t):
        return [r for r in range(self.batch) if r <= t]

    def step(self):
        s = random_step(self.rng, self.batch, self.H, self.P, self.N, self.G)
        return {name: tensor(getattr(s, name), self.act, self.device)
                for name in ("x", "dt", "B", "C", "z")}

    def oracle(self, state):
        return Mamba2Oracle(state, self.A, self.D, self.dt_bias, dt_softplus=True)

    def random_state(self, dtype):
        return tensor(random_state(self.rng, self.slots, self.H, self.P, self.N), dtype,
                      self.device)

    def out(self):
        return torch.full((self.batch, self.H, self.P), float("nan"), dtype=self.act,
                          device=self.device)


def check_out(out, expected, rows, tolerance):
    assert relative_error(out, expected, rows) < tolerance
    assert torch.isnan(out[len(rows):].float()).all(), "pad rows must stay untouched"


def baseline_rollout(model, state_dtype, steps=6, **call_options):
    state = model.random_state(state_dtype)
    oracle = model.oracle(state)
    for t in range(steps):
        inputs = model.step()
        expected = oracle.step(**inputs, slots=model.oracle_slots(t))
        out = model.out()
        replayssm.selective_state_update(
            state, inputs["x"], inputs["dt"], model.A, inputs["B"], inputs["C"], model.D,
            inputs["z"], model.dt_bias, True, model.indices(t), out=out, **call_options)
        if "stream" in call_options:
            torch.cuda.synchronize()
        check_out(out, expected, model.active(t),
                  max(TOLERANCE[model.act], STATE_TOLERANCE[state_dtype]))


def replay_step(model, cache, oracle, t, route, L, tolerance, **decode_options):
    """One eager ReplaySSM step (decode, then advance) at step t, checked against the oracle."""
    inputs = model.step()
    expected = oracle.step(**inputs, slots=model.oracle_slots(t))
    out = model.out()
    replayssm.replay_decode(cache, inputs["x"], inputs["dt"], model.A, inputs["B"], inputs["C"],
                            model.D, inputs["z"], model.dt_bias, True, model.indices(t), out=out,
                            route=route, **decode_options)
    replayssm.replay_advance(cache.cursors, L, model.indices(t))
    check_out(out, expected, model.active(t), tolerance)


def replay_rollout(model, state_dtype, route, L, steps, **decode_options):
    layout = replayssm.ReplayCacheLayout(model.H, model.P, model.N, model.G, L,
                                         act_dtype=model.act, state_dtype=state_dtype)
    cache = layout.allocate(torch, model.slots, device=model.device)
    cache.state.copy_(model.random_state(state_dtype))
    oracle = model.oracle(cache.state)
    for t in range(steps):
        replay_step(model, cache, oracle, t, route, L,
                    max(TOLERANCE[model.act], STATE_TOLERANCE[state_dtype]), **decode_options)
    return cache


DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("act, state_dtype", [(torch.float32, torch.float32),
                                              (torch.bfloat16, torch.float32),
                                              (torch.bfloat16, torch.bfloat16),
                                              (torch.float16, torch.float16)])
def test_baseline(device, act, state_dtype):
    baseline_rollout(Model(device, act), state_dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route", ["output_only", "state_and_output", "auto"])
@pytest.mark.parametrize("act, state_dtype", [(torch.float32, torch.float32),
                                              (torch.bfloat16, torch.float32),
                                              (torch.bfloat16, torch.bfloat16)])
def test_replay_across_flushes(device, act, state_dtype, route):
    replay_rollout(Model(device, act), state_dtype, route, L=8, steps=3 * 8 + 4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("window_kernel", ["separate", "fused", "auto"])
def test_replay_with_a_workspace(device, window_kernel):
    """On CUDA the window work runs in a kernel of its own ("separate"); the CPU ignores it."""
    model = Model(device, torch.bfloat16)
    size = replayssm.replay_decode_workspace_bytes(model.batch, model.H, model.P)
    assert size == 4 * model.batch * model.H * model.P
    workspace = torch.empty(size, dtype=torch.uint8, device=device)
    replay_rollout(model, torch.float32, "auto", L=8, steps=3 * 8 + 4, workspace=workspace,
                   window_kernel=window_kernel)


@pytest.mark.parametrize("device", DEVICES)
def test_out_is_allocated_like_x(device):
    model = Model(device, torch.bfloat16)
    s = model.step()
    out = replayssm.selective_state_update(model.random_state(torch.float32), s["x"], s["dt"],
                                           model.A, s["B"], s["C"])
    assert isinstance(out, torch.Tensor)
    assert out.shape == s["x"].shape and out.dtype == s["x"].dtype and out.device == s["x"].device


@pytest.mark.parametrize("device", DEVICES)
def test_errors_surface_as_python_exceptions(device):
    model = Model(device, torch.float32)
    s = model.step()
    state = model.random_state(torch.float32)
    with pytest.raises(replayssm.InvalidArgument,
                       match=r"x.size\(1\)=4 must equal nheads \(state.size\(1\)\)=8"):
        replayssm.selective_state_update(state, s["x"][:, :4], s["dt"], model.A, s["B"], s["C"])
    with pytest.raises(replayssm.InvalidArgument, match=r"B.size\(2\)=64 must equal state_dim"):
        replayssm.selective_state_update(state, s["x"], s["dt"], model.A, s["B"][:, :, :64],
                                         s["C"])
    with pytest.raises(replayssm.InvalidArgument, match="out has dtype float16"):
        replayssm.selective_state_update(state, s["x"], s["dt"], model.A, s["B"], s["C"],
                                         out=s["x"].half())


@requires_cuda
def test_cuda_tensors_must_share_one_device():
    model = Model("cuda", torch.float32)
    s = model.step()
    with pytest.raises(replayssm.InvalidArgument, match="out is on cpu"):
        replayssm.selective_state_update(model.random_state(torch.float32), s["x"], s["dt"],
                                         model.A, s["B"], s["C"], out=torch.empty(s["x"].shape))


@requires_cuda
def test_cuda_runs_on_the_current_stream_and_on_a_given_stream():
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        baseline_rollout(Model("cuda", torch.float32), torch.float32)
    torch.cuda.synchronize()
    baseline_rollout(Model("cuda", torch.float32), torch.float32, stream=side)
    baseline_rollout(Model("cuda", torch.float32), torch.float32, stream=side.cuda_stream)


@requires_cuda
@pytest.mark.parametrize("route", ["output_only", "state_and_output"])
def test_cuda_graph_of_a_32_step_decode_loop(route):
    """Capture 32 steps (decode + advance) once; replay the graph twice: 64 steps, every row
    flushing several times at its own step, the inputs read from static buffers."""
    L, steps = 8, 32
    model = Model("cuda", torch.bfloat16)
    layout = replayssm.ReplayCacheLayout(model.H, model.P, model.N, model.G, L,
                                         act_dtype=torch.bfloat16, state_dtype=torch.float32)
    cache = layout.allocate(torch, model.slots, device="cuda")
    cache.state.copy_(model.random_state(torch.float32))
    oracle = model.oracle(cache.state)

    # Desynchronise the rows eagerly: row r joins at step r.
    for t in range(model.batch):
        replay_step(model, cache, oracle, t, route, L, TOLERANCE[torch.bfloat16])

    indices = model.indices(model.batch)  # every row active from now on
    inputs = [model.step() for _ in range(steps)]
    outs = torch.full((steps, model.batch, model.H, model.P), float("nan"),
                      dtype=torch.bfloat16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for t in range(steps):
            s = inputs[t]
            replayssm.replay_decode(cache, s["x"], s["dt"], model.A, s["B"], s["C"], model.D,
                                    s["z"], model.dt_bias, True, indices, out=outs[t],
                                    route=route)
            replayssm.replay_advance(cache.cursors, L, indices)
    torch.cuda.synchronize()
    assert torch.isnan(outs.float()).all(), "capture must not run the kernels"

    rows = list(range(model.batch))
    for _ in range(2):
        outs.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for t in range(steps):
            expected = oracle.step(**inputs[t], slots=model.slot_of_row)
            assert relative_error(outs[t], expected, rows) < TOLERANCE[torch.bfloat16]
