// The CUDA backend of the speculative entry points (validated, flattened calls from src/api). Same
// serving-engine rules as mamba2_cuda.hpp: the caller's stream only, on the device of the tensors;
// no allocation, no host synchronisation, no host read of a ring, slot or accepted count (CUDA
// graph safe); the grid depends only on the padded batch, the geometry and the dtypes; pad rows,
// and rows whose slot, ring or counts are out of range on the device, return before touching the
// states, the rings or their out rows (some kernels read the row's own inputs first).
#pragma once

#include "api/spec_params.hpp"

namespace replayssm::cuda {

void spec_verify(const SpecVerifyParams& p, void* stream);
void spec_state_update(const SpecBaselineParams& p, void* stream);
void spec_commit(const SpecRingParams& p, void* stream);
void spec_reset(const SpecRingParams& p, void* stream);

}  // namespace replayssm::cuda
