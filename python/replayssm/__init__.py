"""replayssm: Mamba-2 decoding that moves half the bytes (ReplaySSM), on DLPack arrays.

Entry points (mamba-ssm / vLLM names and argument order):
    selective_state_update  the baseline decode step
    replay_decode           the ReplaySSM decode step on a ReplayCache
    replay_decode_workspace_bytes  the size of replay_decode's optional CUDA workspace
    replay_advance          moves every cursor on by one step (once per model step)
    replay_reset            empties the buffers of slots that start new requests
ReplayCacheLayout sizes and allocates a layer's ReplayCache in any framework.
"""

from ._replayssm import CudaError, InvalidArgument, built_with_cuda, cuda_device_count
from .cache import ReplayCache, ReplayCacheLayout
from .mamba2 import (PAD_SLOT_ID, replay_advance, replay_decode, replay_decode_workspace_bytes,
                     replay_reset, selective_state_update)

__version__ = "0.1.0"

__all__ = [
    "PAD_SLOT_ID",
    "CudaError",
    "InvalidArgument",
    "ReplayCache",
    "ReplayCacheLayout",
    "built_with_cuda",
    "cuda_device_count",
    "replay_advance",
    "replay_decode",
    "replay_decode_workspace_bytes",
    "replay_reset",
    "selective_state_update",
]
