// Typed launchers of the speculative kernels, one explicit instantiation set per state dtype
// (mamba2_spec_*.cu) so that the kernels compile in parallel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "api/spec_params.hpp"

namespace replayssm::cuda {

constexpr int kSpecThreads = 128;         // four warps, each taking one state row at a time
constexpr int64_t kMaxSpecStateDim = 256;  // columns a warp holds in registers

// How a speculative kernel is launched: one CTA per (row, head, chunk of rows_per_cta head_dim
// rows); ctas_per_row = heads * chunks. vectorised: 16-byte state accesses.
struct SpecLaunch {
  int rows_per_cta = 0;
  int64_t ctas_per_row = 0;
  bool vectorised = false;
};

// Shared memory of a CTA, in bytes (the layouts are listed in the kernels).
inline int64_t spec_verify_smem_bytes(const SpecVerifyParams& p, int rows_per_cta) {
  const int64_t L = p.buffer_len, T = p.window, N = p.state_dim;
  return (L * N + T * N + L * rows_per_cta + T * L + 2 * L + T + 1) * int64_t(sizeof(float));
}
inline int64_t spec_baseline_smem_bytes(const SpecBaselineParams& p, int rows_per_cta) {
  const int64_t T = p.window, N = p.state_dim;
  return (2 * T * N + T * rows_per_cta + 2 * T) * int64_t(sizeof(float));
}

template <typename S, typename Act>
void launch_spec_verify(const SpecVerifyParams& p, const SpecLaunch& launch, cudaStream_t stream);
template <typename S, typename Act>
void launch_spec_baseline(const SpecBaselineParams& p, const SpecLaunch& launch, cudaStream_t stream);

}  // namespace replayssm::cuda
