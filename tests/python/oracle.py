"""The fp64 Mamba-2 recurrence, one token at a time, in numpy: the oracle of the Python tests.

Written here, independently of the library, from the contract: dt = softplus(dt + dt_bias)
(threshold 20), S = exp(dt A) S + dt x B^T, y = S C + D x, y *= silu(z).
"""

import numpy as np


def as_float64(array):
    """An array of any framework (numpy, PyTorch; bfloat16 included) as a float64 numpy array."""
    if hasattr(array, "detach"):  # torch: through float32, which holds every 16-bit value
        return array.detach().float().cpu().numpy().astype(np.float64)
    return np.asarray(array).astype(np.float64)


def softplus(v):
    return np.where(v > 20.0, v, np.log1p(np.exp(np.minimum(v, 20.0))))


class Mamba2Oracle:
    """fp64 states of every slot, advanced by `step` exactly as the contract says."""

    def __init__(self, state, A, D=None, dt_bias=None, dt_softplus=False):
        self.state = as_float64(state).copy()  # (slots, H, P, N)
        self.A = as_float64(A)                 # (H)
        self.D = None if D is None else as_float64(D)
        self.dt_bias = None if dt_bias is None else as_float64(dt_bias)
        self.dt_softplus = dt_softplus

    def step(self, x, dt, B, C, z=None, slots=None):
        """Outputs (batch, H, P) float64; rows whose slot is None are skipped (NaN outputs)."""
        x, dt, B, C = (as_float64(a) for a in (x, dt, B, C))
        z = None if z is None else as_float64(z)
        batch, H, P = x.shape
        G = B.shape[1]
        heads_per_group = H // G
        slots = list(range(batch)) if slots is None else slots
        y = np.full((batch, H, P), np.nan)
        for row, slot in enumerate(slots):
            if slot is None:
                continue
            delta = dt[row] + (0.0 if self.dt_bias is None else self.dt_bias)
            if self.dt_softplus:
                delta = softplus(delta)
            for h in range(H):
                g = h // heads_per_group
                S = self.state[slot, h]
                S *= np.exp(delta[h] * self.A[h])
                S += delta[h] * np.outer(x[row, h], B[row, g])
                out = S @ C[row, g]
                if self.D is not None:
                    out = out + self.D[h] * x[row, h]
                if z is not None:
                    out = out * z[row, h] / (1.0 + np.exp(-z[row, h]))
                y[row, h] = out
        return y


def relative_error(actual, expected, rows):
    """max |actual - expected| over the given rows, relative to max |expected| there."""
    a = as_float64(actual)[rows]
    e = expected[rows]
    return float(np.max(np.abs(a - e)) / max(np.max(np.abs(e)), 1e-30))
