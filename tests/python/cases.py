"""Random Mamba-2 decode inputs, made in numpy and handed to any framework by a converter."""

import dataclasses

import numpy as np

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

# (H, P, N, G): small odd shapes plus a real one (Mamba-2 2.7B heads, cut to few heads).
GEOMETRIES = [(4, 8, 16, 2), (3, 5, 7, 1), (6, 16, 32, 3), (8, 64, 128, 1)]


def numpy_dtype(name):
    if name == "bfloat16":
        if ml_dtypes is None:
            return None
        return ml_dtypes.bfloat16
    return np.dtype(name).type


@dataclasses.dataclass
class Layer:
    """Per-layer parameters (float32 numpy)."""
    A: np.ndarray        # (H)
    D: np.ndarray        # (H)
    dt_bias: np.ndarray  # (H)


@dataclasses.dataclass
class Step:
    """Per-step inputs (float32 numpy, to be cast to the activation dtype)."""
    x: np.ndarray   # (batch, H, P)
    dt: np.ndarray  # (batch, H)
    B: np.ndarray   # (batch, G, N)
    C: np.ndarray   # (batch, G, N)
    z: np.ndarray   # (batch, H, P)


def random_layer(rng, H):
    return Layer(A=-rng.uniform(0.5, 8.0, H).astype(np.float32),
                 D=rng.uniform(-1.0, 1.0, H).astype(np.float32),
                 dt_bias=rng.uniform(-4.0, -2.0, H).astype(np.float32))


def random_step(rng, batch, H, P, N, G):
    def normal(*shape):
        return rng.standard_normal(shape).astype(np.float32)
    return Step(x=normal(batch, H, P), dt=rng.uniform(-1.0, 1.0, (batch, H)).astype(np.float32),
                B=normal(batch, G, N), C=normal(batch, G, N), z=normal(batch, H, P))


def random_state(rng, slots, H, P, N):
    return (0.5 * rng.standard_normal((slots, H, P, N))).astype(np.float32)
