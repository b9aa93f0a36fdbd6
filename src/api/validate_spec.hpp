// Argument validation of the speculative entry points (see validate.hpp): checks everything, then
// flattens the call into params. Throws InvalidArgument naming the argument and the numbers;
// writes nothing.
#pragma once

#include "api/spec_params.hpp"

namespace replayssm {

// options: the workspace and the choice of path (CUDA only).
SpecVerifyParams validate_spec_verify(const SpecCache& cache, const Mamba2Window& window,
                                      int64_t buffer_len, Backend backend, const ExecOptions& options);
SpecBaselineParams validate_spec_state_update(const TensorView& state, const Mamba2Window& window,
                                              const TensorView& num_accepted_tokens, Backend backend);
SpecRingParams validate_spec_commit(const TensorView& ring, const TensorView& num_accepted_tokens,
                                    int64_t window, int64_t buffer_len,
                                    const TensorView& state_batch_indices, int64_t pad_slot_id,
                                    Backend backend);
SpecRingParams validate_spec_reset(const TensorView& ring, const TensorView& slots,
                                   int64_t pad_slot_id, Backend backend);

}  // namespace replayssm
