"""The per-layer ReplaySSM cache: its layout, its size, and its allocation in any framework."""

import dataclasses

_ACT_DTYPES = ("float32", "float16", "bfloat16")
_STATE_DTYPES = ("float32", "float16", "bfloat16")
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4}
_MAX_BUFFER_LEN = 64


def _dtype_name(dtype):
    """'bfloat16' for "bfloat16", torch.bfloat16, numpy.float32, ml_dtypes.bfloat16, ..."""
    if isinstance(dtype, str):
        return dtype
    name = getattr(dtype, "__name__", None) or str(dtype)
    return name.rsplit(".", 1)[-1]


class ReplayCache:
    """One layer's ReplaySSM cache (see ``replay_decode`` for the contract).

    Attributes (slot axis first):
        state: (slots, H, P, N) the checkpoint (mutated on flush rows).
        x_cache: (slots, H, L, P) act, B_cache: (slots, G, L, N) act,
        dt_cache: (slots, H, L) float32: the input buffers (mutated).
        cursors: (slots) int32: tokens in each slot's buffer; one tensor may be shared by every
            layer of a model (mutated by ``replay_advance`` / ``replay_reset``).
    """

    __slots__ = ("state", "x_cache", "B_cache", "dt_cache", "cursors")

    def __init__(self, state, x_cache, B_cache, dt_cache, cursors):
        self.state = state
        self.x_cache = x_cache
        self.B_cache = B_cache
        self.dt_cache = dt_cache
        self.cursors = cursors

    @property
    def buffer_len(self):
        """L, the number of tokens a buffer holds before a flush."""
        return self.x_cache.shape[2]

    @property
    def nbytes(self):
        """Bytes of each tensor and their "total" (a shared cursors tensor counts in each layer)."""
        sizes = {name: int(getattr(self, name).nbytes) for name in self.__slots__}
        sizes["total"] = sum(sizes.values())
        return sizes


@dataclasses.dataclass(frozen=True)
class ReplayCacheLayout:
    """The geometry of a Mamba-2 layer and the buffer length: all an engine needs to size and
    allocate a ``ReplayCache`` without knowing its layout.

    Example (PyTorch, Nemotron-H layer, 256 request slots)::

        layout = ReplayCacheLayout(nheads=128, head_dim=64, state_dim=128, ngroups=8,
                                   buffer_len=16, act_dtype="bfloat16", state_dtype="float32")
        layout.nbytes(slots=256)["total"]
        cursors = None
        caches = []
        for _ in range(num_layers):
            caches.append(layout.allocate(torch, slots=256, device="cuda", cursors=cursors))
            cursors = caches[0].cursors  # every layer shares the first layer's cursors
    """

    nheads: int
    head_dim: int
    state_dim: int
    ngroups: int
    buffer_len: int
    act_dtype: str = "bfloat16"
    state_dtype: str = "float32"

    def __post_init__(self):
        object.__setattr__(self, "act_dtype", _dtype_name(self.act_dtype))
        object.__setattr__(self, "state_dtype", _dtype_name(self.state_dtype))
        for name in ("nheads", "head_dim", "state_dim", "ngroups"):
            if getattr(self, name) < 1:
                raise ValueError(f"replayssm: {name}={getattr(self, name)} must be >= 1")
        if self.nheads % self.ngroups != 0:
            raise ValueError(
                f"replayssm: ngroups={self.ngroups} must divide nheads={self.nheads}")
        if not 1 <= self.buffer_len <= _MAX_BUFFER_LEN:
            raise ValueError(
                f"replayssm: buffer_len={self.buffer_len} (L) must be in [1, {_MAX_BUFFER_LEN}]")
        if self.act_dtype not in _ACT_DTYPES:
            raise ValueError(
                f"replayssm: act_dtype={self.act_dtype!r} must be one of {_ACT_DTYPES}")
        if self.state_dtype not in _STATE_DTYPES:
            raise ValueError(
                f"replayssm: state_dtype={self.state_dtype!r} must be one of {_STATE_DTYPES}")

    def shapes(self, slots):
        """{tensor name: (shape, dtype name)} of a cache with `slots` request slots."""
        H, P, N, G, L = self.nheads, self.head_dim, self.state_dim, self.ngroups, self.buffer_len
        return {
            "state": ((slots, H, P, N), self.state_dtype),
            "x_cache": ((slots, H, L, P), self.act_dtype),
            "B_cache": ((slots, G, L, N), self.act_dtype),
            "dt_cache": ((slots, H, L), "float32"),
            "cursors": ((slots,), "int32"),
        }

    def nbytes(self, slots):
        """Bytes of each tensor of a cache with `slots` request slots, and their "total"."""
        sizes = {}
        for name, (shape, dtype) in self.shapes(slots).items():
            count = 1
            for extent in shape:
                count *= extent
            sizes[name] = count * _ITEMSIZE[dtype]
        sizes["total"] = sum(sizes.values())
        return sizes

    def allocate(self, xp, slots, device=None, cursors=None):
        """A zero-filled ``ReplayCache`` (zero states, empty buffers) allocated by `xp`.

        Args:
            xp: the array module to allocate with: ``torch``, ``numpy``, ``cupy``, ... (anything
                with ``zeros(shape, dtype=...)`` and its dtypes as attributes; numpy takes
                bfloat16 from ml_dtypes).
            slots: the number of request slots (the engine's maximum batch).
            device: passed to ``xp.zeros`` when given (e.g. "cuda" for torch).
            cursors: an existing (slots) int32 cursors array to share (all layers of a model
                see the same tokens); None allocates a new one.
        """
        if cursors is not None and tuple(cursors.shape) != (slots,):
            raise ValueError(
                f"replayssm: cursors has shape {tuple(cursors.shape)} but must be ({slots},)")
        kwargs = {} if device is None else {"device": device}
        arrays = {}
        for name, (shape, dtype) in self.shapes(slots).items():
            if name == "cursors" and cursors is not None:
                arrays[name] = cursors
            else:
                arrays[name] = xp.zeros(shape, dtype=_framework_dtype(xp, dtype), **kwargs)
        return ReplayCache(**arrays)


def _framework_dtype(xp, name):
    dtype = getattr(xp, name, None)
    if dtype is None and name == "bfloat16" and getattr(xp, "__name__", "") == "numpy":
        try:
            import ml_dtypes
        except ImportError:
            raise TypeError(
                "replayssm: numpy has no bfloat16: install ml_dtypes to allocate bfloat16 "
                "caches with numpy") from None
        dtype = ml_dtypes.bfloat16
    if dtype is None:
        raise TypeError(f"replayssm: {getattr(xp, '__name__', xp)} has no dtype {name}")
    return dtype
