"""Mamba-2 decode entry points on any DLPack array (numpy, PyTorch, CuPy, JAX).

Names, argument order and defaults follow mamba-ssm / vLLM. Every array is used in place, never
copied: arguments documented as *mutated* are written through the producer's memory and must be
writable. H heads of head dim P, G groups of state dim N (H % G == 0); "act" is the activation
dtype, float32, float16 or bfloat16 (numpy: ``ml_dtypes.bfloat16``), shared by x, B, C, z, out
and the x/B caches. Every tensor's last axis must be contiguous; other strides are free.

Keyword-only options of every entry point:
    stream: the CUDA stream to launch on: a raw ``cudaStream_t`` int or a stream object
        (``__cuda_stream__``, ``.cuda_stream`` or ``.ptr``). Default: PyTorch's current stream
        when the first tensor is a PyTorch CUDA tensor, else the legacy default stream.
    backend: "auto" (the tensors' device decides), "cuda", "cpu" or "reference" (the fp64
        step-by-step oracle, CPU arrays only; it also takes a float64 state).

Errors are raised before anything is written: ``replayssm.InvalidArgument`` (a ValueError)
naming the argument and the numbers, ``TypeError`` for an object that is not an array.
"""

import sys

from . import _replayssm
from ._streams import launch

PAD_SLOT_ID = -1
"""The default pad slot id (vLLM's PAD_SLOT_ID): rows mapped to it are skipped."""

_BACKENDS = {"auto": 0, "reference": 1, "cpu": 2, "cuda": 3}
_ROUTES = {"auto": 0, "output_only": 1, "state_and_output": 2}
_WINDOW_KERNELS = {"auto": 0, "fused": 1, "separate": 2}


def _code(table, value, what):
    try:
        return table[value]
    except KeyError:
        raise ValueError(
            f"replayssm: {what}={value!r} is not one of {', '.join(map(repr, table))}") from None


def _empty_like(x):
    """An uninitialised array like x from x's own framework (the default ``out``)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return torch.empty_like(x)
    namespace = getattr(x, "__array_namespace__", None)
    if namespace is not None:
        return namespace().empty_like(x)
    raise TypeError(
        f"replayssm: cannot allocate out for x of type {type(x).__name__}: pass out=")


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None,
                           dt_softplus=False, state_batch_indices=None, pad_slot_id=PAD_SLOT_ID,
                           out=None, *, stream=None, backend="auto"):
    """Baseline Mamba-2 decode step: reads and writes the whole state.

    Args:
        state: (slots, H, P, N) float32 / float16 / bfloat16 (float64 on the reference
            backend). **Mutated**: the state of every non-pad row's slot is advanced one step.
        x: (batch, H, P) act.
        dt: (batch, H), or (batch, H, P) with stride 0 on P; act or float32; raw (before
            dt_bias and softplus).
        A: (H), or (H, P, N) with zero strides on P and N; float32 / float16 / bfloat16.
        B, C: (batch, G, N) act.
        D: optional (H), or (H, P) with stride 0; y += D * x.
        z: optional (batch, H, P) act; y *= silu(z).
        dt_bias: optional (H), or (H, P) with stride 0; dt += dt_bias.
        dt_softplus: dt = softplus(dt) (threshold 20) after the bias.
        state_batch_indices: optional (batch) int32: the slot of each row; absent: row i uses
            slot i.
        pad_slot_id: rows whose slot is this id are skipped; their out rows are left untouched.
        out: optional (batch, H, P) act. **Mutated** (written). Allocated like x when None.

    Returns:
        out.
    """
    if out is None:
        out = _empty_like(x)
    launch_stream, torch_direct = launch(state, stream)
    _replayssm.selective_state_update(
        state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id, out,
        launch_stream, torch_direct, _code(_BACKENDS, backend, "backend"))
    return out


def replay_decode(cache, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                  state_batch_indices=None, pad_slot_id=PAD_SLOT_ID, out=None, *,
                  route="auto", workspace=None, window_kernel="auto", stream=None,
                  backend="auto"):
    """ReplaySSM decode step: the outputs of ``selective_state_update``, one state read.

    Args:
        cache: a ``replayssm.ReplayCache`` (or any object with the same five attributes),
            L = cache.x_cache.shape[2] in [1, 64]:
            state (slots, H, P, N) float32 / float16 / bfloat16: the checkpoint. **Mutated** on
                flush rows only (rows whose cursor is L - 1): the state after this step.
            x_cache (slots, H, L, P) act, B_cache (slots, G, L, N) act, dt_cache (slots, H, L)
                float32. **Mutated**: non-flush rows store their x, B and raw dt (widened to
                float32) at position ``cursors[slot]``.
            cursors (slots) int32: tokens in each slot's buffer; read only (see
                ``replay_advance``).
        x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id: as in
            ``selective_state_update``.
        out: optional (batch, H, P) act. **Mutated** (written). Allocated like x when None.
        route: how non-flush rows compute their output: "output_only" (never forms the state),
            "state_and_output" (forms it, then y = S C), or "auto" (the backend picks).
        workspace: optional scratch for the CUDA backend (others ignore it): a contiguous 1-D
            device array of at least ``replay_decode_workspace_bytes(batch, H, P)`` bytes,
            16-byte aligned; layers on one stream can share it. **Mutated** (scratch). With it
            the call can take the split path: a lean read of the checkpoint, then the window
            work once per group of heads, then the flush rows (faster from batch 8 on an H200).
        window_kernel: with a workspace, "auto" (by the size of the call), "separate" (the
            split path) or "fused" (one kernel, as without a workspace).

    Returns:
        out.
    """
    if out is None:
        out = _empty_like(x)
    state = cache.state
    launch_stream, torch_direct = launch(state, stream)
    _replayssm.replay_decode(
        state, cache.x_cache, cache.B_cache, cache.dt_cache, cache.cursors,
        x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id, out,
        _code(_ROUTES, route, "route"), workspace,
        _code(_WINDOW_KERNELS, window_kernel, "window_kernel"), launch_stream, torch_direct,
        _code(_BACKENDS, backend, "backend"))
    return out


def replay_decode_workspace_bytes(batch, nheads, head_dim):
    """Bytes of ``workspace`` a CUDA ``replay_decode`` of this shape needs."""
    return _replayssm.replay_decode_workspace_bytes(batch, nheads, head_dim)


def replay_advance(cursors, buffer_len, state_batch_indices=None, pad_slot_id=PAD_SLOT_ID, *,
                   stream=None, backend="auto"):
    """Moves the buffers on by one step, on the cursors' device.

    Call once per model step, after every layer sharing ``cursors`` has decoded.

    Args:
        cursors: (slots) int32. **Mutated**: cursors[slot] = (cursors[slot] + 1) % buffer_len
            for the slot of every non-pad row (state_batch_indices absent: every slot).
        buffer_len: L, in [1, 64].
        state_batch_indices: optional (batch) int32, as given to ``replay_decode``.
        pad_slot_id: rows whose slot is this id are skipped.
    """
    launch_stream, torch_direct = launch(cursors, stream)
    _replayssm.replay_advance(cursors, buffer_len, state_batch_indices, pad_slot_id,
                              launch_stream, torch_direct, _code(_BACKENDS, backend, "backend"))


def replay_reset(cursors, slots, pad_slot_id=PAD_SLOT_ID, *, stream=None, backend="auto"):
    """Starts slots over for new requests: empties their buffers.

    The caller writes each new request's initial state (zeros, or its prefill state) into
    ``state[slot]``, exactly as for the baseline.

    Args:
        cursors: (slots) int32. **Mutated**: cursors[slot] = 0 for each listed slot.
        slots: (n) int32 slot ids; entries equal to pad_slot_id are skipped.
        pad_slot_id: the id to skip.
    """
    launch_stream, torch_direct = launch(cursors, stream)
    _replayssm.replay_reset(cursors, slots, pad_slot_id, launch_stream, torch_direct,
                            _code(_BACKENDS, backend, "backend"))
