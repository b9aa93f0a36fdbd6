// Definitions of the typed launchers; included by the per-state-dtype instantiation files only.
#pragma once

#include <type_traits>

#include "cuda/check.hpp"
#include "cuda/mamba2_kernels.cuh"
#include "cuda/mamba2_launch.hpp"

namespace replayssm::cuda {

// (head, chunk) along x, batch rows along y; bounded by the caller (mamba2_cuda.cu).
inline dim3 decode_grid(const Mamba2Params& p, int rows_per_cta) {
  const int64_t chunks = (p.head_dim + rows_per_cta - 1) / rows_per_cta;
  return dim3(unsigned(p.nheads * chunks), unsigned(p.batch));
}

template <typename S, typename Act>
void launch_state_update(const Mamba2Params& p, RowLayoutKind layout, int rows_per_cta,
                         cudaStream_t stream) {
  const dim3 grid = decode_grid(p, rows_per_cta);
  const size_t smem = size_t(baseline_smem_bytes(rows_per_cta, p.state_dim, sizeof(S)));
  switch (layout) {
    case RowLayoutKind::kN64:
      state_update_kernel<S, Act, RowLayoutKind::kN64><<<grid, kThreads, smem, stream>>>(p, rows_per_cta);
      break;
    case RowLayoutKind::kN128:
      state_update_kernel<S, Act, RowLayoutKind::kN128><<<grid, kThreads, smem, stream>>>(p, rows_per_cta);
      break;
    case RowLayoutKind::kN256:
      state_update_kernel<S, Act, RowLayoutKind::kN256><<<grid, kThreads, smem, stream>>>(p, rows_per_cta);
      break;
    case RowLayoutKind::kGeneric:
      state_update_kernel<S, Act, RowLayoutKind::kGeneric><<<grid, kThreads, smem, stream>>>(p, rows_per_cta);
      break;
  }
  REPLAYSSM_CUDA_CHECK(cudaGetLastError());
}

template <typename S, typename Act>
void launch_replay_decode(const ReplayParams& p, RowLayoutKind layout, int rows_per_cta,
                          cudaStream_t stream) {
  const bool output_only = p.route != ReplayRoute::kStateAndOutput;
  // The split path (p.workspace set): the window kernel first, then the decode kernel launched
  // as its programmatic dependent, so that its checkpoint copies start while the window work runs.
  if (p.workspace) {
    const int heads = window_heads(p.heads_per_group, p.buffer_len, p.head_dim, p.state_dim, sizeof(Act));
    const dim3 window_grid(unsigned(p.ngroups * ((p.heads_per_group + heads - 1) / heads)),
                           unsigned(p.batch));
    const size_t window_smem =
        size_t(window_smem_bytes(heads, p.buffer_len, p.head_dim, p.state_dim, sizeof(Act)));
    replay_window_kernel<Act><<<window_grid, kWindowThreads, window_smem, stream>>>(p, heads);
    REPLAYSSM_CUDA_CHECK(cudaGetLastError());
  }
  cudaLaunchAttribute after_window;
  after_window.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  after_window.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = decode_grid(p, rows_per_cta);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = size_t(replay_smem_bytes(rows_per_cta, p.state_dim, sizeof(S),
                                                     p.buffer_len, make_row_layout(sizeof(S), layout).lanes));
  config.stream = stream;
  config.attrs = p.workspace ? &after_window : nullptr;
  config.numAttrs = p.workspace ? 1 : 0;
  auto run = [&](auto stochastic, auto split) {
    constexpr bool kStochastic = decltype(stochastic)::value, kSplit = decltype(split)::value;
    auto launch = [&](auto kernel) {
      REPLAYSSM_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p, rows_per_cta, output_only));
    };
    switch (layout) {
      case RowLayoutKind::kN64:
        return launch(replay_decode_kernel<S, Act, RowLayoutKind::kN64, kStochastic, kSplit>);
      case RowLayoutKind::kN128:
        return launch(replay_decode_kernel<S, Act, RowLayoutKind::kN128, kStochastic, kSplit>);
      case RowLayoutKind::kN256:
        return launch(replay_decode_kernel<S, Act, RowLayoutKind::kN256, kStochastic, kSplit>);
      case RowLayoutKind::kGeneric:
        // The split path covers the vectorised layouts only (mamba2_cuda.cu).
        if constexpr (!kSplit)
          return launch(replay_decode_kernel<S, Act, RowLayoutKind::kGeneric, kStochastic, false>);
        break;
    }
  };
  // An fp32 checkpoint is never rounded (validation refuses stochastic rounding for it), and the
  // split path rounds to nearest only (mamba2_cuda.cu).
  if (p.workspace) {
    run(std::false_type{}, std::true_type{});
  } else if constexpr (std::is_same_v<S, float>) {
    run(std::false_type{}, std::false_type{});
  } else {
    if (p.stochastic_rounding) run(std::true_type{}, std::false_type{});
    else run(std::false_type{}, std::false_type{});
  }
  REPLAYSSM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace replayssm::cuda

// Instantiates the replay launcher for state type S and every activation type (the 8-bit
// checkpoint formats have no baseline).
#define REPLAYSSM_INSTANTIATE_REPLAY_LAUNCHERS(S)                                                \
  template void replayssm::cuda::launch_replay_decode<S, float>(                                 \
      const replayssm::ReplayParams&, replayssm::cuda::RowLayoutKind, int, cudaStream_t);        \
  template void replayssm::cuda::launch_replay_decode<S, replayssm::Half>(                       \
      const replayssm::ReplayParams&, replayssm::cuda::RowLayoutKind, int, cudaStream_t);        \
  template void replayssm::cuda::launch_replay_decode<S, replayssm::BFloat16>(                   \
      const replayssm::ReplayParams&, replayssm::cuda::RowLayoutKind, int, cudaStream_t)

// Instantiates both launchers for state type S and every activation type.
#define REPLAYSSM_INSTANTIATE_LAUNCHERS(S)                                                       \
  template void replayssm::cuda::launch_state_update<S, float>(                                  \
      const replayssm::Mamba2Params&, replayssm::cuda::RowLayoutKind, int, cudaStream_t);        \
  template void replayssm::cuda::launch_state_update<S, replayssm::Half>(                        \
      const replayssm::Mamba2Params&, replayssm::cuda::RowLayoutKind, int, cudaStream_t);        \
  template void replayssm::cuda::launch_state_update<S, replayssm::BFloat16>(                    \
      const replayssm::Mamba2Params&, replayssm::cuda::RowLayoutKind, int, cudaStream_t);        \
  REPLAYSSM_INSTANTIATE_REPLAY_LAUNCHERS(S)
