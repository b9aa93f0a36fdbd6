// Host side of the CUDA backend: picks the row layout and the launch configuration, dispatches on
// the dtypes, and runs the cursor kernels.
#include "cuda/mamba2_cuda.hpp"

#include <cstdint>
#include <type_traits>

#include "cuda/check.hpp"
#include "cuda/launch_shape.hpp"
#include "cuda/mamba2_launch.hpp"
#include "cuda/row_layout.hpp"

namespace replayssm::cuda {
namespace {

// The automatic choice keeps whole heads in one CTA (the per-CTA window work is then shared by
// the most rows) unless that leaves fewer than this many CTAs per SM: at small batch, smaller
// chunks put more loads in flight and shorten each CTA's serial work.
constexpr int64_t kTargetCtasPerSm = 16;
// The split path (a workspace, WindowKernel::kAuto) from this many decode CTAs per SM: its three
// launches cost a few microseconds of latency that the smallest calls do not hide (H200,
// Nemotron-H, L = 16, notes/cuda.md v11: faster from batch 8, about 16 CTAs per SM, with an fp32
// and a bf16 state; slower at batch 1).
constexpr int64_t kWindowKernelMinCtasPerSm = 12;
constexpr int kCursorThreads = 256;

RowLayoutKind choose_layout(const Mamba2Params& p, const ReplayParams* replay) {
  const RowLayoutKind kind = vectorised_layout(p);
  if (kind == RowLayoutKind::kGeneric || !replay) return kind;
  const bool ok = aligned(replay->B_cache, dtype_size(p.act_dtype), slice_access_bytes(p, kind),
                          {replay->Bc_stride_slot, replay->Bc_stride_group, replay->Bc_stride_pos});
  return ok ? kind : RowLayoutKind::kGeneric;
}

// head_dim rows per CTA (launch_shape.hpp), by the kernel's shared memory.
int decode_rows_per_cta(const Mamba2Params& p, const ReplayParams* replay, RowLayoutKind kind,
                        const LaunchConfig& config) {
  const int64_t s = dtype_size(p.state_dtype);
  const int lanes = make_row_layout(int(s), kind).lanes;
  return rows_per_cta_for(p, kind, config.rows_per_cta, kTargetCtasPerSm, kMaxSharedBytes, [&](int64_t rows) {
    return replay ? replay_smem_bytes(rows, p.state_dim, s, replay->buffer_len, lanes)
                  : baseline_smem_bytes(rows, p.state_dim, s);
  });
}

// Calls run(S{}, Act{}) with the call's state and activation types (8-bit checkpoints: replay only;
// validation refuses them elsewhere).
template <typename Params, typename Run> void with_dtypes(const Params& p, const Run& run) {
  auto with_act = [&](auto state_tag) {
    switch (p.act_dtype) {
      case DType::kFloat16: return run(state_tag, Half{});
      case DType::kBFloat16: return run(state_tag, BFloat16{});
      default: return run(state_tag, float{});
    }
  };
  switch (p.state_dtype) {
    case DType::kFloat16: return with_act(Half{});
    case DType::kBFloat16: return with_act(BFloat16{});
    case DType::kInt8:
      if constexpr (std::is_same_v<Params, ReplayParams>) return with_act(Int8{});
      break;
    case DType::kFloat8E4M3:
      if constexpr (std::is_same_v<Params, ReplayParams>) return with_act(Float8E4M3{});
      break;
    default: return with_act(float{});
  }
}

// The small-batch kernels in the automatic choice: calls of at most this many head_dim rows an SM
// (batch 8 of Nemotron-H on an H200), where the tile kernels' chains of dependent loads are what a
// step waits for (notes/cuda.md v37).
constexpr int64_t kSmallBatchMaxRowsPerSm = 512;
// Two state rows a row group from this many head_dim rows an SM: fewer, longer CTAs share their
// window work between more rows once the grid has several CTAs an SM.
constexpr int64_t kSmallBatchTwoRowsPerSm = 128;
constexpr int64_t kMaxGridYZ = 65535;

// head_dim rows per CTA of the small-batch kernels for this call, or 0 where the tile kernels run:
// those cover the generic layout, 8-bit checkpoints, the state-and-output route, stochastic
// rounding, and calls past kSmallBatchMaxRowsPerSm unless config.small_batch forces them.
int small_batch_rows_per_cta(const Mamba2Params& p, const ReplayParams* replay, RowLayoutKind kind,
                             const LaunchConfig& config) {
  const int64_t s = dtype_size(p.state_dtype);
  if (config.small_batch == 0 || kind == RowLayoutKind::kGeneric || s == 1 || p.batch > kMaxGridYZ ||
      p.nheads > kMaxGridYZ)
    return 0;
  if (replay && (replay->route == ReplayRoute::kStateAndOutput || replay->stochastic_rounding)) return 0;
  const int64_t rows_per_sm = p.batch * p.nheads * p.head_dim / sm_count();
  if (config.small_batch < 0 && rows_per_sm > kSmallBatchMaxRowsPerSm) return 0;
  const int groups = make_row_layout(int(s), kind).row_groups;
  const bool two = config.rows_per_cta > 0 ? config.rows_per_cta >= 2 * groups
                                           : rows_per_sm >= kSmallBatchTwoRowsPerSm;
  return two ? 2 * groups : groups;
}

// The split path needs the caller's workspace and the output-only route (the state-and-output
// route forms every row's state anyway); it is compiled for the vectorised layouts and for
// rounding to nearest, its window kernel moves x, z, the cached x and the outputs in packs of
// window_rows_per_thread() head_dim rows, and its flush kernel's window must fit shared memory.
bool uses_window_kernel(const ReplayParams& p, RowLayoutKind kind, int rows_per_cta,
                        const LaunchConfig& config) {
  const WindowKernel choice = config.window_kernel < 0 ? p.window_kernel
                              : config.window_kernel == 0 ? WindowKernel::kFused
                                                          : WindowKernel::kSeparate;
  if (!p.workspace || p.route == ReplayRoute::kStateAndOutput || p.stochastic_rounding ||
      kind == RowLayoutKind::kGeneric || choice == WindowKernel::kFused)
    return false;
  if (choice == WindowKernel::kAuto && ctas_for(p, rows_per_cta) < kWindowKernelMinCtasPerSm * sm_count())
    return false;
  const int rows = window_rows_per_thread(p);
  const int64_t a = dtype_size(p.act_dtype), pack = rows * a;
  const bool packed = p.head_dim % rows == 0 &&
                      aligned(p.x, a, pack, {p.x_stride_batch, p.x_stride_head}) &&
                      (!p.z || aligned(p.z, a, pack, {p.z_stride_batch, p.z_stride_head})) &&
                      aligned(p.out, a, pack, {p.out_stride_batch, p.out_stride_head}) &&
                      aligned(p.x_cache, a, pack, {p.xc_stride_slot, p.xc_stride_head, p.xc_stride_pos});
  const RowLayout l = make_row_layout(int(dtype_size(p.state_dtype)), kind);
  return packed && window_heads(p.heads_per_group, p.head_dim, rows) > 0 &&
         flush_smem_bytes(l.batch_rows, p.state_dim, dtype_size(p.state_dtype), p.buffer_len,
                          l.lanes) + kFlushScanBytes <= kMaxSharedBytes;
}

// Stochastic rounding: each flush row counts its flush once every head of the row has drawn its
// bits from the old count (a kernel of its own, after the decode kernel).
__global__ void count_flushes_kernel(const ReplayParams p) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= p.batch) return;
  const int64_t slot = p.state_batch_indices ? p.state_batch_indices[row * p.state_batch_indices_stride] : row;
  if ((p.state_batch_indices && slot == p.pad_slot_id) || slot < 0 || slot >= p.slots) return;
  if (p.cursors[slot * p.cursors_stride] != p.buffer_len - 1) return;
  int32_t* count = p.flush_counts + slot * p.flush_counts_stride;
  *count = int32_t(uint32_t(*count) + 1u);  // wraps: the key only needs to differ between flushes
}

__global__ void advance_kernel(const CursorParams p) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.count) return;
  const int64_t slot = p.slot_ids ? p.slot_ids[i * p.slot_ids_stride] : i;
  if ((p.slot_ids && slot == p.pad_slot_id) || slot < 0 || slot >= p.slots) return;
  int32_t* cursor = p.cursors + slot * p.cursors_stride;
  *cursor = *cursor + 1 == p.buffer_len ? 0 : *cursor + 1;
}

__global__ void reset_kernel(const CursorParams p) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.count) return;
  const int64_t slot = p.slot_ids[i * p.slot_ids_stride];
  if (slot == p.pad_slot_id || slot < 0 || slot >= p.slots) return;
  p.cursors[slot * p.cursors_stride] = 0;
}

unsigned cursor_grid(const CursorParams& p) {
  return unsigned((p.count + kCursorThreads - 1) / kCursorThreads);
}

}  // namespace

LaunchConfig auto_launch_config(const Mamba2Params& p) {
  const RowLayoutKind kind = choose_layout(p, nullptr);
  const int small_rows = small_batch_rows_per_cta(p, nullptr, kind, LaunchConfig{});
  if (small_rows > 0) return LaunchConfig{small_rows, -1, 1};
  return LaunchConfig{decode_rows_per_cta(p, nullptr, kind, LaunchConfig{}), -1, 0};
}

LaunchConfig auto_launch_config(const ReplayParams& p) {
  const RowLayoutKind kind = choose_layout(p, &p);
  const int small_rows = small_batch_rows_per_cta(p, &p, kind, LaunchConfig{});
  if (small_rows > 0) return LaunchConfig{small_rows, -1, 1};
  return LaunchConfig{decode_rows_per_cta(p, &p, kind, LaunchConfig{}), -1, 0};
}

void selective_state_update(const Mamba2Params& p, const LaunchConfig& config, void* stream) {
  const ScopedDevice on_device(p.device_index);
  const RowLayoutKind kind = choose_layout(p, nullptr);
  const int small_rows = small_batch_rows_per_cta(p, nullptr, kind, config);
  const int rows = small_rows > 0 ? small_rows : decode_rows_per_cta(p, nullptr, kind, config);
  if (p.batch == 0) return;
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  with_dtypes(p, [&](auto state_tag, auto act_tag) {
    using S = decltype(state_tag);
    using Act = decltype(act_tag);
    if (small_rows > 0) launch_small_batch_state_update<S, Act>(p, kind, rows, cuda_stream);
    else launch_state_update<S, Act>(p, kind, rows, cuda_stream);
  });
}

void replay_decode(const ReplayParams& p, const LaunchConfig& config, void* stream) {
  const ScopedDevice on_device(p.device_index);
  const RowLayoutKind kind = choose_layout(p, &p);
  // A split path the caller asks for is kept; the automatic choice puts small batches first.
  const bool forced_split = config.window_kernel == 1 ||
                            (config.window_kernel < 0 && p.workspace && p.window_kernel == WindowKernel::kSeparate);
  const int small_rows = forced_split ? 0 : small_batch_rows_per_cta(p, &p, kind, config);
  const int rows = small_rows > 0 ? small_rows : decode_rows_per_cta(p, &p, kind, config);
  if (p.batch == 0) return;
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  ReplayParams run = p;
  int flush_rows = 0;
  if (small_rows == 0 && uses_window_kernel(p, kind, rows, config)) {
    const int64_t s = dtype_size(p.state_dtype);
    const int lanes = make_row_layout(int(s), kind).lanes;
    flush_rows = rows_per_cta_for(p, kind, rows, 0, kMaxSharedBytes - kFlushScanBytes, [&](int64_t r) {
      return flush_smem_bytes(r, p.state_dim, s, p.buffer_len, lanes);
    });
  } else {
    run.workspace = nullptr;
  }
  with_dtypes(run, [&](auto state_tag, auto act_tag) {
    using S = decltype(state_tag);
    using Act = decltype(act_tag);
    if constexpr (!CheckpointFormat<S>::kScaled) {
      if (small_rows > 0) return launch_small_batch_replay<S, Act>(run, kind, rows, cuda_stream);
    }
    launch_replay_decode<S, Act>(run, kind, rows, flush_rows, cuda_stream);
  });
  if (p.stochastic_rounding) {
    const unsigned blocks = unsigned((p.batch + kCursorThreads - 1) / kCursorThreads);
    count_flushes_kernel<<<blocks, kCursorThreads, 0, cuda_stream>>>(p);
    REPLAYSSM_CUDA_CHECK(cudaGetLastError());
  }
}

void selective_state_update(const Mamba2Params& p, void* stream) {
  selective_state_update(p, LaunchConfig{}, stream);
}

void replay_decode(const ReplayParams& p, void* stream) { replay_decode(p, LaunchConfig{}, stream); }

void replay_advance(const CursorParams& p, void* stream) {
  if (p.count == 0) return;
  const ScopedDevice on_device(p.device_index);
  advance_kernel<<<cursor_grid(p), kCursorThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  REPLAYSSM_CUDA_CHECK(cudaGetLastError());
}

void replay_reset(const CursorParams& p, void* stream) {
  if (p.count == 0) return;
  const ScopedDevice on_device(p.device_index);
  reset_kernel<<<cursor_grid(p), kCursorThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  REPLAYSSM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace replayssm::cuda
