"""CPU tests on numpy arrays: every entry point against the fp64 oracle, the cache contract,
the allocation helper, and the DLPack import (strides, read-only, capsule rules, errors)."""

import ctypes
import sys

import numpy as np
import pytest

import replayssm
from cases import GEOMETRIES, numpy_dtype, random_layer, random_state, random_step
from oracle import Mamba2Oracle, relative_error

# Output tolerance (relative to the largest |output|) by (activation dtype, state dtype): fp32 is
# exact arithmetic in fp32; 16-bit outputs are rounded once; a 16-bit state is rounded per flush.
TOLERANCE = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 2e-2}
STATE_TOLERANCE = {"float32": 2e-5, "float16": 5e-3, "bfloat16": 4e-2}

# numpy exports read-only arrays (flagged) only through DLPack 1.0 capsules, from numpy 2.1 on.
requires_dlpack_1 = pytest.mark.skipif(
    tuple(int(v) for v in np.__version__.split(".")[:2]) < (2, 1),
    reason="numpy < 2.1 cannot export read-only arrays")


def act_dtype_or_skip(name):
    dtype = numpy_dtype(name)
    if dtype is None:
        pytest.skip("numpy bfloat16 needs ml_dtypes")
    return dtype


def tolerance(act, state):
    return max(TOLERANCE[act], STATE_TOLERANCE[state])


def nan_array(shape, dtype):
    return np.full(shape, np.nan, dtype=np.float32).astype(dtype)


def bits(array):
    """The raw bytes of an array, to compare without rounding (NaNs included)."""
    return np.ascontiguousarray(array).view(np.uint8)


class Rollout:
    """A batch whose rows join one step apart (row r is a pad row for its first r steps), so
    that the rows sit at different buffer positions and flush at different steps."""

    def __init__(self, rng, geometry, act, batch=4, slots=6):
        self.rng = rng
        self.H, self.P, self.N, self.G = geometry
        self.act = act_dtype_or_skip(act)
        self.batch = batch
        self.slot_of_row = rng.permutation(slots)[:batch].astype(np.int32)
        self.layer = random_layer(rng, self.H)

    def indices(self, t):
        return np.where(np.arange(self.batch) <= t, self.slot_of_row,
                        replayssm.PAD_SLOT_ID).astype(np.int32)

    def step(self, t):
        s = random_step(self.rng, self.batch, self.H, self.P, self.N, self.G)
        return {name: getattr(s, name).astype(self.act) for name in ("x", "dt", "B", "C", "z")}

    def active(self, t):
        return [row for row in range(self.batch) if row <= t]

    def oracle_slots(self, t):
        return [int(self.slot_of_row[row]) if row <= t else None for row in range(self.batch)]


@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("act", ["float32", "float16", "bfloat16"])
def test_selective_state_update_matches_oracle(geometry, act):
    rng = np.random.default_rng(1)
    ro = Rollout(rng, geometry, act)
    H, P, N = ro.H, ro.P, ro.N
    state = random_state(rng, 6, H, P, N)
    oracle = Mamba2Oracle(state, ro.layer.A, ro.layer.D, ro.layer.dt_bias, dt_softplus=True)
    for t in range(6):
        inputs = ro.step(t)
        expected = oracle.step(**inputs, slots=ro.oracle_slots(t))
        before = state.copy()
        out = nan_array((ro.batch, H, P), ro.act)
        result = replayssm.selective_state_update(
            state, inputs["x"], inputs["dt"], ro.layer.A, inputs["B"], inputs["C"], ro.layer.D,
            inputs["z"], ro.layer.dt_bias, True, ro.indices(t), replayssm.PAD_SLOT_ID, out)
        assert result is out
        active = ro.active(t)
        assert relative_error(out, expected, active) < TOLERANCE[act]
        assert np.isnan(out[len(active):].astype(np.float32)).all(), "pad rows must stay untouched"
        for slot in range(6):
            if slot in ro.slot_of_row[active]:
                assert relative_error(state[slot], oracle.state[slot], slice(None)) < 2e-5
            else:
                assert np.array_equal(bits(state[slot]), bits(before[slot]))


def run_replay_rollout(geometry, act, state_dtype, route, L, use_optional=True, seed=2,
                       **decode_options):
    rng = np.random.default_rng(seed)
    ro = Rollout(rng, geometry, act)
    H, P, N, G = ro.H, ro.P, ro.N, ro.G
    layout = replayssm.ReplayCacheLayout(H, P, N, G, L, act_dtype=act, state_dtype=state_dtype)
    cache = layout.allocate(np, slots=6)
    cache.state[...] = random_state(rng, 6, H, P, N).astype(cache.state.dtype)
    D = ro.layer.D if use_optional else None
    dt_bias = ro.layer.dt_bias if use_optional else None
    oracle = Mamba2Oracle(cache.state, ro.layer.A, D, dt_bias, dt_softplus=use_optional)
    flushes = 0
    for t in range(3 * L + ro.batch):
        inputs = ro.step(t)
        z = inputs["z"] if use_optional else None
        expected = oracle.step(inputs["x"], inputs["dt"], inputs["B"], inputs["C"], z,
                               slots=ro.oracle_slots(t))
        state_before = cache.state.copy()
        cursors_before = cache.cursors.copy()
        out = nan_array((ro.batch, H, P), ro.act)
        indices = ro.indices(t)
        replayssm.replay_decode(cache, inputs["x"], inputs["dt"], ro.layer.A, inputs["B"],
                                inputs["C"], D, z, dt_bias, use_optional, indices,
                                out=out, route=route, **decode_options)
        active = ro.active(t)
        assert relative_error(out, expected, active) < tolerance(act, state_dtype)
        assert np.isnan(out[len(active):].astype(np.float32)).all(), "pad rows must stay untouched"
        active_slots = set(int(s) for s in ro.slot_of_row[active])
        for row in active:
            slot = int(ro.slot_of_row[row])
            c = int(cursors_before[slot])
            if c == L - 1:  # flush: the state after this step is the new checkpoint
                flushes += 1
                err = relative_error(cache.state[slot], oracle.state[slot], slice(None))
                assert err < STATE_TOLERANCE[state_dtype]
            else:  # the token is cached bit-exactly at the cursor; the checkpoint is untouched
                assert np.array_equal(bits(cache.state[slot]), bits(state_before[slot]))
                assert np.array_equal(bits(cache.x_cache[slot, :, c]), bits(inputs["x"][row]))
                assert np.array_equal(cache.dt_cache[slot, :, c],
                                      inputs["dt"][row].astype(np.float32))
                assert np.array_equal(bits(cache.B_cache[slot, :, c]), bits(inputs["B"][row]))
        for slot in set(range(6)) - active_slots:
            assert np.array_equal(bits(cache.state[slot]), bits(state_before[slot]))
        replayssm.replay_advance(cache.cursors, L, indices)
        expected_cursors = cursors_before.copy()
        for slot in active_slots:
            expected_cursors[slot] = (cursors_before[slot] + 1) % L
        assert np.array_equal(cache.cursors, expected_cursors)
    assert flushes >= 2 * ro.batch


@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("act", ["float32", "bfloat16"])
@pytest.mark.parametrize("route", ["output_only", "state_and_output"])
def test_replay_decode_matches_oracle_across_flushes(geometry, act, route):
    run_replay_rollout(geometry, act, "float32", route, L=4)


@pytest.mark.parametrize("state_dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("act", ["float16", "bfloat16"])
def test_replay_decode_low_precision_state(act, state_dtype):
    run_replay_rollout((4, 8, 16, 2), act, state_dtype, "auto", L=8)


@pytest.mark.parametrize("L", [1, 2, 16])
def test_replay_decode_buffer_lengths_without_optional_arguments(L):
    run_replay_rollout((3, 5, 7, 1), "float32", "float32", "auto", L, use_optional=False)


def test_replay_decode_on_the_cpu_ignores_a_workspace():
    H, P = 4, 8
    workspace = np.empty(replayssm.replay_decode_workspace_bytes(4, H, P), np.uint8)
    assert workspace.size == 4 * 4 * H * P
    run_replay_rollout((H, P, 16, 2), "float32", "float32", "auto", L=4, workspace=workspace,
                       window_kernel="separate")


def test_reference_backend_takes_a_float64_state():
    rng = np.random.default_rng(3)
    H, P, N, G = 4, 8, 16, 2
    state = random_state(rng, 3, H, P, N).astype(np.float64)
    layer = random_layer(rng, H)
    oracle = Mamba2Oracle(state, layer.A, layer.D, layer.dt_bias, dt_softplus=True)
    s = random_step(rng, 3, H, P, N, G)
    expected = oracle.step(s.x, s.dt, s.B, s.C, s.z)
    out = replayssm.selective_state_update(state, s.x, s.dt, layer.A, s.B, s.C, layer.D, s.z,
                                           layer.dt_bias, True, backend="reference")
    assert relative_error(out, expected, slice(None)) < 1e-6
    assert np.abs(state - oracle.state).max() < 1e-12
    with pytest.raises(replayssm.InvalidArgument, match="float64"):
        replayssm.selective_state_update(state, s.x, s.dt, layer.A, s.B, s.C, backend="cpu")


@requires_dlpack_1
def test_strided_inputs_are_read_in_place():
    """x, B and C as column slices of one projection buffer; dt and A broadcast by zero strides
    (numpy marks broadcast views read-only, which inputs may be)."""
    rng = np.random.default_rng(4)
    H, P, N, G, batch = 4, 8, 16, 2, 3
    layer = random_layer(rng, H)
    s = random_step(rng, batch, H, P, N, G)
    state = random_state(rng, batch, H, P, N)
    xBC = rng.standard_normal((batch, H * P + 2 * G * N + 5)).astype(np.float32)
    x = xBC[:, :H * P].reshape(batch, H, P)
    B = xBC[:, H * P:H * P + G * N].reshape(batch, G, N)
    C = xBC[:, H * P + G * N:H * P + 2 * G * N].reshape(batch, G, N)
    assert np.shares_memory(x, xBC) and not x.flags.c_contiguous
    dt = np.broadcast_to(s.dt[:, :, None], (batch, H, P))
    A = np.broadcast_to(layer.A[:, None, None], (H, P, N))
    assert not dt.flags.writeable and dt.strides[2] == 0
    expected_state = state.copy()
    expected = replayssm.selective_state_update(
        expected_state, np.ascontiguousarray(x), s.dt, layer.A, np.ascontiguousarray(B),
        np.ascontiguousarray(C), dt_softplus=True)
    out = replayssm.selective_state_update(state, x, dt, A, B, C, dt_softplus=True)
    assert np.array_equal(out, expected)
    assert np.array_equal(state, expected_state)


def test_replay_reset_and_advance():
    cursors = np.array([3, 1, 2, 0, 3], dtype=np.int32)
    replayssm.replay_advance(cursors, 4)
    assert cursors.tolist() == [0, 2, 3, 1, 0]
    replayssm.replay_advance(cursors, 4, np.array([4, -1, 1], dtype=np.int32))
    assert cursors.tolist() == [0, 3, 3, 1, 1]
    replayssm.replay_reset(cursors, np.array([1, -1, 2], dtype=np.int32))
    assert cursors.tolist() == [0, 0, 0, 1, 1]
    with pytest.raises(replayssm.InvalidArgument, match=r"slots\[0\]=7 is out of range"):
        replayssm.replay_reset(cursors, np.array([7], dtype=np.int32))
    with pytest.raises(replayssm.InvalidArgument, match="buffer_len=65"):
        replayssm.replay_advance(cursors, 65)


def test_layout_sizes_and_allocates_a_cache():
    layout = replayssm.ReplayCacheLayout(nheads=128, head_dim=64, state_dim=128, ngroups=8,
                                         buffer_len=16, act_dtype="float16",
                                         state_dtype=np.float32)
    assert layout.state_dtype == "float32"
    shapes = layout.shapes(slots=3)
    assert shapes["state"] == ((3, 128, 64, 128), "float32")
    assert shapes["x_cache"] == ((3, 128, 16, 64), "float16")
    assert shapes["B_cache"] == ((3, 8, 16, 128), "float16")
    assert shapes["dt_cache"] == ((3, 128, 16), "float32")
    assert shapes["cursors"] == ((3,), "int32")
    sizes = layout.nbytes(slots=3)
    assert sizes["state"] == 3 * 128 * 64 * 128 * 4
    assert sizes["total"] == sum(v for k, v in sizes.items() if k != "total")
    cache = layout.allocate(np, slots=3)
    assert cache.nbytes == sizes
    assert cache.buffer_len == 16
    assert cache.x_cache.dtype == np.float16 and cache.cursors.dtype == np.int32
    assert not cache.state.any() and not cache.cursors.any()
    second_layer = layout.allocate(np, slots=3, cursors=cache.cursors)
    assert second_layer.cursors is cache.cursors
    with pytest.raises(ValueError, match="cursors has shape"):
        layout.allocate(np, slots=4, cursors=cache.cursors)


def test_layout_allocates_bfloat16_with_ml_dtypes():
    act_dtype_or_skip("bfloat16")
    cache = replayssm.ReplayCacheLayout(4, 8, 16, 2, 4, "bfloat16", "bfloat16").allocate(np, 2)
    assert cache.state.dtype.name == "bfloat16" and cache.B_cache.dtype.name == "bfloat16"


@pytest.mark.parametrize("kwargs, message", [
    (dict(nheads=6, ngroups=4), "ngroups=4 must divide nheads=6"),
    (dict(buffer_len=65), r"buffer_len=65 \(L\) must be in \[1, 64\]"),
    (dict(act_dtype="int32"), "act_dtype='int32'"),
    (dict(head_dim=0), "head_dim=0 must be >= 1"),
])
def test_layout_rejects_bad_geometry(kwargs, message):
    args = dict(nheads=4, head_dim=8, state_dim=16, ngroups=2, buffer_len=4) | kwargs
    with pytest.raises(ValueError, match=message):
        replayssm.ReplayCacheLayout(**args)


class Step4:
    """Valid small fp32 arguments for error tests."""

    def __init__(self):
        rng = np.random.default_rng(5)
        H, P, N, G, batch = 4, 8, 16, 2, 2
        self.state = random_state(rng, batch, H, P, N)
        s = random_step(rng, batch, H, P, N, G)
        self.x, self.dt, self.B, self.C = s.x, s.dt, s.B, s.C
        self.A = random_layer(rng, H).A
        self.out = np.zeros_like(self.x)

    def call(self, **changes):
        args = dict(state=self.state, x=self.x, dt=self.dt, A=self.A, B=self.B, C=self.C,
                    out=self.out) | changes
        return replayssm.selective_state_update(**args)


def test_library_errors_name_the_argument_and_the_numbers():
    s = Step4()
    with pytest.raises(replayssm.InvalidArgument,
                       match=r"x.size\(1\)=3 must equal nheads \(state.size\(1\)\)=4"):
        s.call(x=s.x[:, :3])
    with pytest.raises(ValueError, match=r"B.size\(1\)=3 \(ngroups\) must divide nheads=4"):
        s.call(B=np.zeros((2, 3, 16), np.float32))
    with pytest.raises(replayssm.InvalidArgument, match="x has dtype float64"):
        s.call(x=s.x.astype(np.float64))
    with pytest.raises(replayssm.InvalidArgument, match=r"state_batch_indices\[1\]=9 is out of range"):
        s.call(state_batch_indices=np.array([0, 9], np.int32))
    with pytest.raises(replayssm.InvalidArgument, match="state_batch_indices has dtype float32"):
        s.call(state_batch_indices=np.array([0, 1], np.float32))
    with pytest.raises(replayssm.InvalidArgument, match="x is required"):
        s.call(x=None)
    with pytest.raises(replayssm.InvalidArgument, match="CUDA backend is not available|CUDA tensors"):
        s.call(backend="cuda")
    with pytest.raises(ValueError, match="backend='gpu' is not one of"):
        s.call(backend="gpu")


def test_replay_errors_name_the_argument_and_the_numbers():
    s = Step4()
    cache = replayssm.ReplayCacheLayout(4, 8, 16, 2, 4, "float32", "float32").allocate(np, 2)
    cache.cursors[1] = 4
    with pytest.raises(replayssm.InvalidArgument, match=r"cursors\[1\]=4 \(row 1\) is out of range"):
        replayssm.replay_decode(cache, s.x, s.dt, s.A, s.B, s.C)
    cache.cursors[1] = 0
    with pytest.raises(ValueError, match="route='fast' is not one of"):
        replayssm.replay_decode(cache, s.x, s.dt, s.A, s.B, s.C, route="fast")
    with pytest.raises(ValueError, match="window_kernel='split' is not one of"):
        replayssm.replay_decode(cache, s.x, s.dt, s.A, s.B, s.C, window_kernel="split")
    with pytest.raises(replayssm.InvalidArgument, match="must not be negative"):
        replayssm.replay_decode_workspace_bytes(-1, 4, 8)
    small = replayssm.ReplayCacheLayout(4, 8, 16, 2, 4, "float32", "float32").allocate(np, 1)
    with pytest.raises(replayssm.InvalidArgument, match="x.size\\(0\\)=2 \\(batch\\) exceeds"):
        replayssm.replay_decode(small, s.x, s.dt, s.A, s.B, s.C)


@requires_dlpack_1
def test_written_arguments_must_be_writable():
    s = Step4()
    read_only_out = np.zeros_like(s.x)
    read_only_out.flags.writeable = False
    with pytest.raises(replayssm.InvalidArgument, match="out is read-only"):
        s.call(out=read_only_out)
    read_only_state = s.state.copy()
    read_only_state.flags.writeable = False
    with pytest.raises(replayssm.InvalidArgument, match="state is read-only"):
        s.call(state=read_only_state)
    cursors = np.zeros(3, np.int32)
    cursors.flags.writeable = False
    with pytest.raises(replayssm.InvalidArgument, match="cursors is read-only"):
        replayssm.replay_advance(cursors, 4)
    read_only_x = s.x.copy()
    read_only_x.flags.writeable = False
    s.call(x=read_only_x)  # inputs may be read-only


def test_non_arrays_are_type_errors():
    s = Step4()
    with pytest.raises(TypeError, match="x must be an array implementing __dlpack__"):
        s.call(x=[[1.0]])
    with pytest.raises(TypeError, match="stream must be an int"):
        s.call(stream="default")


def capsule_name(capsule):
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.py_object]
    return get_name(capsule).decode()


class LegacyProducer:
    """A DLPack producer older than DLPack 1.0 (no max_version): hands out numpy's legacy
    capsule and keeps it, so that the test can see what the consumer did with it."""

    def __init__(self, array):
        self.array = array
        self.capsules = []

    def __dlpack__(self, stream=None):
        capsule = self.array.__dlpack__()
        self.capsules.append(capsule)
        return capsule

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_legacy_capsules_are_consumed_and_released():
    s = Step4()
    expected = s.call(state=s.state.copy(), out=np.zeros_like(s.x))
    out = np.zeros_like(s.x)
    producer = LegacyProducer(out)
    references = sys.getrefcount(out)
    s.call(out=producer)
    assert capsule_name(producer.capsules[0]) == "used_dltensor"
    assert np.array_equal(out, expected)
    producer.capsules.clear()
    after = sys.getrefcount(out)  # outside the assert: pytest's rewriting holds references
    assert after == references, "the producer's deleter must run after the call"


def test_versioned_capsules_are_released_on_success_and_on_error():
    s = Step4()
    references = sys.getrefcount(s.x)
    for _ in range(3):
        s.call()
    after_success = sys.getrefcount(s.x)  # outside the assert: pytest's rewriting holds references
    for _ in range(3):
        with pytest.raises(replayssm.InvalidArgument):
            s.call(C=s.C[:, :1])
    after_error = sys.getrefcount(s.x)
    assert after_success == references and after_error == references


class NotACapsule:
    def __dlpack__(self, stream=None, max_version=None):
        return 42

    def __dlpack_device__(self):
        return (1, 0)


class RefusingProducer:
    def __dlpack__(self, stream=None, max_version=None):
        raise BufferError("this producer exports nothing")

    def __dlpack_device__(self):
        return (1, 0)


def test_bad_producers_raise_with_the_argument_name():
    s = Step4()
    with pytest.raises(replayssm.InvalidArgument, match="dt: __dlpack__\\(\\) returned a int"):
        s.call(dt=NotACapsule())
    with pytest.raises(replayssm.InvalidArgument, match="B: __dlpack__\\(\\) failed: BufferError"):
        s.call(B=RefusingProducer())


def test_stream_arguments():
    from replayssm._streams import stream_handle

    class TorchLike:
        cuda_stream = 0x1234

    class CupyLike:
        ptr = 0x5678

    class CudaStreamProtocol:
        def __cuda_stream__(self):
            return (0, 0x9abc)

    assert stream_handle(7) == 7
    assert stream_handle(TorchLike()) == 0x1234
    assert stream_handle(CupyLike()) == 0x5678
    assert stream_handle(CudaStreamProtocol()) == 0x9abc
    s = Step4()
    s.call(stream=0)  # CPU arrays: the stream is not used
