// Argument validation shared by every backend: checks everything, then flattens the call into
// params. Throws InvalidArgument naming the argument and the numbers; writes nothing.
#pragma once

#include "api/params.hpp"

namespace replayssm {

// The backend that will run a call on tensors living on `device`.
Backend resolve_backend(Backend requested, Device device);

Mamba2Params validate_state_update(const TensorView& state, const Mamba2Step& step, Backend backend);
// `workspace` (ExecOptions::workspace) is checked and used on the CUDA backend only.
ReplayParams validate_replay_decode(const ReplayCache& cache, const Mamba2Step& step,
                                    ReplayRoute route, Backend backend,
                                    const TensorView& workspace = {});
CursorParams validate_advance(const TensorView& cursors, int64_t buffer_len,
                              const TensorView& state_batch_indices, int64_t pad_slot_id,
                              Backend backend);
CursorParams validate_reset(const TensorView& cursors, const TensorView& slots, int64_t pad_slot_id,
                            Backend backend);

}  // namespace replayssm
