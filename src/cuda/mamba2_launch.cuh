// Definitions of the typed launchers; included by the per-state-dtype instantiation files only.
#pragma once

#include <algorithm>
#include <type_traits>

#include "cuda/check.hpp"
#include "cuda/launch_shape.hpp"
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
                          int flush_rows_per_cta, cudaStream_t stream) {
  const bool output_only = p.route != ReplayRoute::kStateAndOutput;
  const RowLayout shape = make_row_layout(sizeof(S), layout);
  auto by_layout = [&](auto launch_for) {
    switch (layout) {
      case RowLayoutKind::kN64: return launch_for(std::integral_constant<RowLayoutKind, RowLayoutKind::kN64>{});
      case RowLayoutKind::kN128: return launch_for(std::integral_constant<RowLayoutKind, RowLayoutKind::kN128>{});
      case RowLayoutKind::kN256: return launch_for(std::integral_constant<RowLayoutKind, RowLayoutKind::kN256>{});
      case RowLayoutKind::kGeneric: return launch_for(std::integral_constant<RowLayoutKind, RowLayoutKind::kGeneric>{});
    }
  };
  cudaLaunchAttribute after_previous;
  after_previous.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  after_previous.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  const size_t decode_smem =
      size_t(replay_smem_bytes(rows_per_cta, p.state_dim, sizeof(S), p.buffer_len, shape.lanes));

  if (!p.workspace && one_kernel_is_dot_kernel(p, layout)) {  // one kernel: the dot kernel with the window
    if constexpr (!CheckpointFormat<S>::kScaled) {
      const DotShape dot = one_kernel_dot_shape(p, sizeof(S), shape);
      const OneKernelSmem smem = one_kernel_smem(p, sizeof(S), dot, shape);
      config.gridDim = dim3(unsigned(dot_ctas_per_row(p, dot)), unsigned(p.batch));
      config.dynamicSmemBytes = size_t(smem.bytes);
      by_layout([&](auto kind) {
        constexpr RowLayoutKind k = decltype(kind)::value;
        if constexpr (k == RowLayoutKind::kN64 || k == RowLayoutKind::kN128) {
          auto kernel = checkpoint_dot_kernel<S, Act, k, false, true>;
          // A 2-byte state keeps the CUDA-core fold here: with the tensor cores' the kernel spills
          // (N = 128) and was 1-4% slower at batch 2-8 (notes/cuda.md, v59).
          if constexpr (kTensorCoreFold<S, Act, Layout<S, k>> && sizeof(S) == 4)
            if (p.buffer_len > kTensorFoldMinTokens) kernel = checkpoint_dot_kernel<S, Act, k, true, true>;
          allow_smem(kernel, smem.bytes);
          REPLAYSSM_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p, dot.heads, dot.rows, smem.part_rows));
        }
      });
      return;
    }
  }
  if (!p.workspace) {  // one kernel does everything
    config.gridDim = decode_grid(p, rows_per_cta);
    config.dynamicSmemBytes = decode_smem;
    auto run = [&](auto stochastic) {
      by_layout([&](auto kind) {
        REPLAYSSM_CUDA_CHECK(cudaLaunchKernelEx(
            &config, replay_decode_kernel<S, Act, decltype(kind)::value, decltype(stochastic)::value>,
            p, rows_per_cta, output_only));
      });
    };
    // An fp32 checkpoint is never rounded (validation refuses stochastic rounding for it).
    if constexpr (std::is_same_v<S, float>) {
      run(std::false_type{});
    } else {
      if (p.stochastic_rounding) run(std::true_type{});
      else run(std::false_type{});
    }
    return;
  }

  // The split path (vectorised layouts, rounding to nearest: mamba2_cuda.cu): the checkpoint
  // dots, the flush rows folded there too where dot_flush_part_rows_for says so; then, each as the
  // programmatic dependent of the one before, so that its loads start while that one finishes, the
  // window kernel (non-flush rows' window work and outputs) and, for the other flush rows, the
  // flush kernel. Flush rows are few (one in L when rows are desynchronised): the flush grid has up
  // to ceil(batch / L) CTAs per (head, chunk), each looping over its share.
  const DotShape dot = dot_shape(p, sizeof(S), shape);
  const int part_rows = dot_flush_part_rows_for(p, sizeof(S), dot, shape);
  config.gridDim = dim3(unsigned(dot_ctas_per_row(p, dot)), unsigned(p.batch));
  config.dynamicSmemBytes = size_t(dot_smem_bytes(dot.heads, dot.rows, p.state_dim, sizeof(S)));
  by_layout([&](auto kind) {
    constexpr RowLayoutKind k = decltype(kind)::value;
    if constexpr (k != RowLayoutKind::kGeneric) {
      auto kernel = checkpoint_dot_kernel<S, Act, k, false, false>;
      if constexpr (kTensorCoreFold<S, Act, Layout<S, k>>)
        if (p.buffer_len > kTensorFoldMinTokens) kernel = checkpoint_dot_kernel<S, Act, k, true, false>;
      REPLAYSSM_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p, dot.heads, dot.rows, part_rows));
    }
  });

  const int window_rows = window_rows_per_thread(p);
  const int heads = window_heads(p.heads_per_group, p.head_dim, window_rows);
  config.gridDim = dim3(unsigned(p.ngroups * ((p.heads_per_group + heads - 1) / heads)), unsigned(p.batch));
  const int64_t threads = window_threads(heads, p.head_dim, window_rows);
  const bool one_round =
      window_one_round(p, int64_t(config.gridDim.x) * config.gridDim.y, threads, window_rows, part_rows);
  const int64_t window_smem =
      window_smem_bytes(threads, window_rows, sizeof(Act), p.buffer_len, p.state_dim, one_round);
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = size_t(window_smem);
  config.attrs = &after_previous;
  config.numAttrs = 1;
  const auto window_kernel =
      window_rows == kWindowRowsMany
          ? (one_round ? replay_window_kernel<Act, kWindowRowsMany, true> : replay_window_kernel<Act, kWindowRowsMany, false>)
          : (one_round ? replay_window_kernel<Act, kWindowRowsFew, true> : replay_window_kernel<Act, kWindowRowsFew, false>);
  allow_smem(window_kernel, window_smem, kWindowStaticBytes);
  REPLAYSSM_CUDA_CHECK(cudaLaunchKernelEx(&config, window_kernel, p, heads));

  if (part_rows > 0) return;  // the dot kernel folded the flush rows
  const int64_t chunks = decode_grid(p, flush_rows_per_cta).x;
  const int64_t flush_rows = std::min(p.batch, (p.batch + p.buffer_len - 1) / p.buffer_len);
  config.gridDim = dim3(unsigned(chunks), unsigned(flush_ctas_per_chunk(kFlushMinCtasPerSm, chunks, flush_rows)));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes =
      size_t(flush_smem_bytes(flush_rows_per_cta, p.state_dim, sizeof(S), p.buffer_len, shape.lanes));
  by_layout([&](auto kind) {
    if constexpr (decltype(kind)::value != RowLayoutKind::kGeneric) {
      const auto kernel = replay_flush_kernel<S, Act, decltype(kind)::value>;
      allow_smem(kernel, int64_t(config.dynamicSmemBytes), kFlushStaticBytes);
      REPLAYSSM_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p, flush_rows_per_cta, output_only));
    }
  });
}

}  // namespace replayssm::cuda

// Instantiates the replay launcher for state type S and every activation type (the 8-bit
// checkpoint formats have no baseline).
#define REPLAYSSM_INSTANTIATE_REPLAY_LAUNCHERS(S)                                                \
  template void replayssm::cuda::launch_replay_decode<S, float>(                                 \
      const replayssm::ReplayParams&, replayssm::cuda::RowLayoutKind, int, int, cudaStream_t);   \
  template void replayssm::cuda::launch_replay_decode<S, replayssm::Half>(                       \
      const replayssm::ReplayParams&, replayssm::cuda::RowLayoutKind, int, int, cudaStream_t);   \
  template void replayssm::cuda::launch_replay_decode<S, replayssm::BFloat16>(                   \
      const replayssm::ReplayParams&, replayssm::cuda::RowLayoutKind, int, int, cudaStream_t)

// Instantiates both launchers for state type S and every activation type.
#define REPLAYSSM_INSTANTIATE_LAUNCHERS(S)                                                       \
  template void replayssm::cuda::launch_state_update<S, float>(                                  \
      const replayssm::Mamba2Params&, replayssm::cuda::RowLayoutKind, int, cudaStream_t);        \
  template void replayssm::cuda::launch_state_update<S, replayssm::Half>(                        \
      const replayssm::Mamba2Params&, replayssm::cuda::RowLayoutKind, int, cudaStream_t);        \
  template void replayssm::cuda::launch_state_update<S, replayssm::BFloat16>(                    \
      const replayssm::Mamba2Params&, replayssm::cuda::RowLayoutKind, int, cudaStream_t);        \
  REPLAYSSM_INSTANTIATE_REPLAY_LAUNCHERS(S)
