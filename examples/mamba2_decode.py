"""A multi-layer Mamba-2 language model with random weights, decoding greedily in PyTorch, with
its SSM step done by replayssm: the baseline (`selective_state_update`) or ReplaySSM
(`replay_decode` + one `replay_advance` per step), chosen by one flag.

    python examples/mamba2_decode.py                      # both methods, tokens/s of each
    python examples/mamba2_decode.py --method replay --batch 128 --L 16
    python examples/mamba2_decode.py --device cpu         # a tiny model on the CPU

On CUDA each decode step (every layer, the sampling and the cursor advance) is captured once
in a CUDA graph and replayed, as a serving engine does (--eager to turn that off).
"""

import argparse
import math
import time

import torch
import torch.nn.functional as F

import replayssm

PRESETS = {  # Nemotron-H's Mamba-2 layer geometry; a tiny one for the CPU
    "nemotron-h": dict(d_model=4096, nheads=128, head_dim=64, state_dim=128, ngroups=8),
    "tiny": dict(d_model=256, nheads=8, head_dim=32, state_dim=64, ngroups=2),
}


class Mamba2Layer(torch.nn.Module):
    """Pre-norm residual block: in_proj -> causal conv (one step) -> SSM step -> out_proj."""

    def __init__(self, d_model, nheads, head_dim, state_dim, ngroups, conv_width=4):
        super().__init__()
        self.H, self.P, self.N, self.G = nheads, head_dim, state_dim, ngroups
        self.d_inner = nheads * head_dim
        self.conv_dim = self.d_inner + 2 * ngroups * state_dim
        self.norm = torch.nn.RMSNorm(d_model)
        self.in_proj = torch.nn.Linear(d_model, self.d_inner + self.conv_dim + nheads, bias=False)
        self.conv_weight = torch.nn.Parameter(torch.randn(self.conv_dim, conv_width) / conv_width)
        self.conv_bias = torch.nn.Parameter(torch.zeros(self.conv_dim))
        self.A = torch.nn.Parameter(-torch.empty(nheads).uniform_(1.0, 16.0))
        self.D = torch.nn.Parameter(torch.ones(nheads))
        dt = torch.exp(torch.empty(nheads).uniform_(math.log(1e-3), math.log(1e-1)))
        self.dt_bias = torch.nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)
        self.out_norm = torch.nn.RMSNorm(self.d_inner)
        self.out_proj = torch.nn.Linear(self.d_inner, d_model, bias=False)

    def forward(self, hidden, conv_state, ssm_step):
        batch = hidden.shape[0]
        z, xBC, dt = torch.split(self.in_proj(self.norm(hidden)),
                                 [self.d_inner, self.conv_dim, self.H], dim=-1)
        conv_state.copy_(torch.cat([conv_state[:, :, 1:], xBC[:, :, None]], dim=-1))
        xBC = F.silu((conv_state * self.conv_weight).sum(-1) + self.conv_bias)
        x, B, C = torch.split(xBC, [self.d_inner, self.G * self.N, self.G * self.N], dim=-1)
        y = ssm_step(self, x.reshape(batch, self.H, self.P), dt,
                     B.reshape(batch, self.G, self.N), C.reshape(batch, self.G, self.N),
                     z.reshape(batch, self.H, self.P))
        return hidden + self.out_proj(self.out_norm(y.reshape(batch, self.d_inner)))


class Model(torch.nn.Module):
    def __init__(self, vocab, layers, **geometry):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, geometry["d_model"])
        self.layers = torch.nn.ModuleList(Mamba2Layer(**geometry) for _ in range(layers))
        self.norm = torch.nn.RMSNorm(geometry["d_model"])
        self.lm_head = torch.nn.Linear(geometry["d_model"], vocab, bias=False)


class Decoder:
    """Per-request caches of one method and one greedy decode step over all layers."""

    def __init__(self, model, method, batch, L, state_dtype):
        self.model, self.method, self.L = model, method, L
        device, act = model.embed.weight.device, model.embed.weight.dtype
        first = model.layers[0]
        self.conv_states = [torch.zeros(batch, layer.conv_dim, layer.conv_weight.shape[1],
                                        device=device, dtype=act) for layer in model.layers]
        layout = replayssm.ReplayCacheLayout(first.H, first.P, first.N, first.G, L,
                                             act_dtype=act, state_dtype=state_dtype)
        if method == "replay":
            self.caches = [layout.allocate(torch, batch, device=device)]
            for _ in model.layers[1:]:  # every layer shares the first layer's cursors
                self.caches.append(layout.allocate(torch, batch, device=device,
                                                   cursors=self.caches[0].cursors))
            self.cache_of = dict(zip(model.layers, self.caches))
        else:
            self.states = {layer: torch.zeros(layout.shapes(batch)["state"][0], device=device,
                                              dtype=getattr(torch, layout.state_dtype))
                           for layer in model.layers}
        self.bytes = (sum(c.nbytes["total"] for c in self.caches) if method == "replay"
                      else sum(s.nbytes for s in self.states.values()))

    def ssm_step(self, layer, x, dt, B, C, z):
        args = (x, dt, layer.A, B, C, layer.D, z, layer.dt_bias, True)
        if self.method == "replay":
            return replayssm.replay_decode(self.cache_of[layer], *args)
        return replayssm.selective_state_update(self.states[layer], *args)

    def step(self, tokens):
        """tokens (batch) int64: replaced by the next tokens; returns the logits."""
        hidden = self.model.embed(tokens)
        for layer, conv_state in zip(self.model.layers, self.conv_states):
            hidden = layer(hidden, conv_state, self.ssm_step)
        logits = self.model.lm_head(self.model.norm(hidden))
        if self.method == "replay":
            replayssm.replay_advance(self.caches[0].cursors, self.L)
        tokens.copy_(logits.argmax(-1))
        return logits


def decode(model, method, prompt, args):
    """(generated tokens (steps, batch), tokens/s, cache bytes)."""
    batch = prompt.shape[0]
    tokens = prompt.clone()
    if prompt.is_cuda and not args.eager:
        # Warm up (cuBLAS workspaces, lazy initialisation) on a side stream with throwaway
        # caches before capturing, as PyTorch's CUDA-graph notes advise.
        warmup = Decoder(model, method, batch, args.L, args.state_dtype)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                warmup.step(tokens.clone())
        torch.cuda.current_stream().wait_stream(side)
        del warmup
    decoder = Decoder(model, method, batch, args.L, args.state_dtype)
    run_step = lambda: decoder.step(tokens)  # noqa: E731
    if prompt.is_cuda and not args.eager:
        # Capture one step (tokens are consumed and replaced in place); the capture does not
        # run the kernels, so the caches are still those of a fresh request afterwards.
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            decoder.step(tokens)
        run_step = graph.replay
    generated = []
    sync = torch.cuda.synchronize if prompt.is_cuda else (lambda: None)
    sync()
    begin = time.perf_counter()
    for _ in range(args.steps):
        run_step()
        generated.append(tokens.clone())
    sync()
    seconds = time.perf_counter() - begin
    return torch.stack(generated), batch * args.steps / seconds, decoder.bytes


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", choices=["baseline", "replay", "both"], default="both")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="layer geometry (default: nemotron-h on CUDA, tiny on the CPU)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--L", type=int, default=16, help="ReplaySSM buffer length")
    parser.add_argument("--dtype", default="bfloat16", help="weights and activations")
    parser.add_argument("--state-dtype", default="float32")
    parser.add_argument("--eager", action="store_true", help="no CUDA graph")
    args = parser.parse_args()
    preset = args.preset or ("nemotron-h" if args.device.startswith("cuda") else "tiny")

    torch.manual_seed(0)
    with torch.device(args.device):  # initialise the weights where they will live
        model = Model(args.vocab, args.layers, **PRESETS[preset])
    model = model.to(dtype=getattr(torch, args.dtype)).eval()
    model.requires_grad_(False)
    prompt = torch.randint(0, args.vocab, (args.batch,), device=args.device)
    print(f"{args.layers} Mamba-2 layers ({preset}: {PRESETS[preset]}), batch {args.batch}, "
          f"{args.steps} steps, {args.dtype} activations, {args.state_dtype} state, "
          f"{'eager' if args.eager or args.device == 'cpu' else 'CUDA graph'} on {args.device}")

    methods = ["baseline", "replay"] if args.method == "both" else [args.method]
    results = {}
    with torch.inference_mode():
        for method in methods:
            label = method if method == "baseline" else f"replay (L={args.L})"
            tokens, rate, nbytes = decode(model, method, prompt, args)
            results[method] = (tokens, rate)
            print(f"{label:<16} {rate:12,.0f} tokens/s   SSM caches {nbytes / 2**20:,.1f} MiB")
    if len(results) == 2:
        same = (results["baseline"][0] == results["replay"][0]).float().mean().item()
        print(f"replay / baseline: {results['replay'][1] / results['baseline'][1]:.2f}x; "
              f"{same:.1%} of the generated tokens agree")


if __name__ == "__main__":
    main()
