// Typed launchers of the decode kernels, one explicit instantiation set per state dtype
// (mamba2_state_*.cu) so that the kernels compile in parallel.
#pragma once

#include <cuda_runtime.h>

#include "api/params.hpp"
#include "cuda/row_layout.hpp"

namespace replayssm::cuda {

// rows_per_cta is a multiple of the layout's batch_rows, at most kMaxRowsPerCta.
template <typename S, typename Act>
void launch_state_update(const Mamba2Params& p, RowLayoutKind layout, int rows_per_cta,
                         cudaStream_t stream);
// flush_rows_per_cta: the split path's flush kernel (p.workspace set).
template <typename S, typename Act>
void launch_replay_decode(const ReplayParams& p, RowLayoutKind layout, int rows_per_cta,
                          int flush_rows_per_cta, cudaStream_t stream);

}  // namespace replayssm::cuda
