"""Which CUDA stream a call launches on, and how its tensors are exported.

Rules (the README's "Python" section states them for users):
- ``stream=`` given: launch on it; an int is a raw ``cudaStream_t`` (0: the legacy default
  stream), an object may expose ``__cuda_stream__()``, ``.cuda_stream`` (PyTorch) or ``.ptr``
  (CuPy);
- otherwise, when the call's first tensor is a PyTorch CUDA tensor and torch is already imported
  (this package never imports it), PyTorch's current stream on that tensor's device;
- otherwise the legacy default stream.

Producers are asked through ``__dlpack__(stream=...)`` to order their pending work before the
launch stream. PyTorch tensors are ordered once per call instead, here, exactly as PyTorch's
``Tensor.__dlpack__`` would for each of them (nothing to do when the launch stream is PyTorch's
current stream), and then exported by PyTorch's C-level exporter: the Python-level
``Tensor.__dlpack__`` costs several microseconds per tensor, more than the kernel at batch 1.
"""

import sys

from . import _replayssm

_torch = {"module": None, "direct_export": False, "current_raw_stream": None}


def _torch_if_imported():
    """torch when the user's program has imported it (set up on first sight), else None."""
    torch = sys.modules.get("torch")
    if torch is None or _torch["module"] is torch:
        return torch
    to_dlpack = getattr(torch._C, "_to_dlpack", None)
    if to_dlpack is not None:
        _replayssm.register_torch(torch.Tensor, to_dlpack)
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw_stream is None:
        def raw_stream(device):
            return torch.cuda.current_stream(device).cuda_stream
    _torch.update(module=torch, direct_export=to_dlpack is not None,
                  current_raw_stream=raw_stream)
    return torch


def stream_handle(stream):
    """The raw cudaStream_t value of a user's ``stream=`` argument."""
    if isinstance(stream, int):
        return stream
    cuda_stream_protocol = getattr(stream, "__cuda_stream__", None)
    if cuda_stream_protocol is not None:
        return int(cuda_stream_protocol()[1])
    for attribute in ("cuda_stream", "ptr"):
        handle = getattr(stream, attribute, None)
        if handle is not None:
            return int(handle)
    raise TypeError(
        "replayssm: stream must be an int (a raw cudaStream_t) or a stream object with "
        f"__cuda_stream__, .cuda_stream or .ptr, got {type(stream).__name__}")


def _order_after_current_stream(torch, device, handle):
    """Makes stream `handle` wait for the work queued so far on PyTorch's current stream."""
    if handle == 0:
        target = torch.cuda.default_stream(device)
    else:
        target = torch.cuda.ExternalStream(handle, device=device)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    target.wait_event(event)


def launch(first_tensor, stream):
    """(raw stream to launch on, whether PyTorch tensors may be exported directly)."""
    torch = _torch_if_imported()
    if torch is None or not isinstance(first_tensor, torch.Tensor):
        return (0 if stream is None else stream_handle(stream)), False
    if not first_tensor.is_cuda:
        return (0 if stream is None else stream_handle(stream)), _torch["direct_export"]
    device = first_tensor.get_device()
    current = _torch["current_raw_stream"](device)
    if stream is None:
        return current, _torch["direct_export"]
    handle = stream_handle(stream)
    if handle != current and _torch["direct_export"]:
        _order_after_current_stream(torch, device, handle)
    return handle, _torch["direct_export"]
