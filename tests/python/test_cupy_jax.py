"""CuPy and JAX arrays on the GPU through DLPack: a ReplaySSM rollout across flushes with every
argument a CuPy array, and one whose read-only inputs are JAX arrays (JAX arrays are immutable, so
the mutated arguments stay CuPy). Compared with the fp64 recurrence of oracle.py."""

import os

import numpy as np
import pytest

import replayssm
from cases import random_layer, random_state, random_step
from oracle import Mamba2Oracle, relative_error

cp = pytest.importorskip("cupy")
if not replayssm.built_with_cuda() or replayssm.cuda_device_count() == 0:
    pytest.skip("needs a GPU and a CUDA build of replayssm", allow_module_level=True)

H, P, N, G, L, BATCH, SLOTS, STEPS = 8, 64, 128, 2, 4, 3, 5, 10  # STEPS crosses two flushes


def rollout(to_input):
    """Runs ReplaySSM for STEPS steps; `to_input` turns each read-only numpy input into the
    framework under test. Returns the worst output error against the oracle."""
    rng = np.random.default_rng(11)
    layer = random_layer(rng, H)
    layout = replayssm.ReplayCacheLayout(H, P, N, G, L, act_dtype="float32",
                                         state_dtype="float32")
    cache = layout.allocate(cp, SLOTS)
    state0 = random_state(rng, SLOTS, H, P, N)
    cache.state[...] = cp.asarray(state0)
    oracle = Mamba2Oracle(state0, layer.A, layer.D, layer.dt_bias, dt_softplus=True)
    slots = rng.permutation(SLOTS)[:BATCH].astype(np.int32)
    indices = cp.asarray(slots)
    A, D, dt_bias = (to_input(v) for v in (layer.A, layer.D, layer.dt_bias))
    worst = 0.0
    for _ in range(STEPS):
        s = random_step(rng, BATCH, H, P, N, G)
        expected = oracle.step(s.x, s.dt, s.B, s.C, s.z, slots=slots.tolist())
        out = cp.full((BATCH, H, P), np.nan, dtype=cp.float32)
        replayssm.replay_decode(cache, *(to_input(v) for v in (s.x, s.dt)), A,
                                *(to_input(v) for v in (s.B, s.C)), D, to_input(s.z), dt_bias,
                                True, indices, out=out)
        replayssm.replay_advance(cache.cursors, L, indices)
        worst = max(worst, relative_error(cp.asnumpy(out), expected, list(range(BATCH))))
    assert cp.asnumpy(cache.cursors)[slots].tolist() == [STEPS % L] * BATCH
    return worst


def test_cupy_arrays_everywhere():
    assert rollout(cp.asarray) < 1e-5


def jax_on_gpu():
    """jax.device_put onto the first GPU JAX sees (skips the test where there is none)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave memory to CuPy
    jax = pytest.importorskip("jax")
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        pytest.skip("JAX sees no GPU")
    return lambda v: jax.device_put(v, gpus[0])


def test_jax_arrays_as_read_only_inputs():
    assert rollout(jax_on_gpu()) < 1e-5


def test_an_immutable_jax_array_cannot_be_written():
    to_jax = jax_on_gpu()
    rng = np.random.default_rng(3)
    layer = random_layer(rng, H)
    s = random_step(rng, 1, H, P, N, G)
    state = to_jax(random_state(rng, 1, H, P, N))
    with pytest.raises((replayssm.InvalidArgument, TypeError, BufferError)):
        replayssm.selective_state_update(
            state, *(cp.asarray(v) for v in (s.x, s.dt, layer.A, s.B, s.C)), dt_softplus=True)
