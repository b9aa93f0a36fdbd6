// Host side of the CUDA backend: picks the row layout and the launch configuration, dispatches on
// the dtypes, and runs the cursor kernels.
#include "cuda/mamba2_cuda.hpp"

#include <algorithm>
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
// Where the dot kernel cannot take the window (dot_window_ctas), the split path (a workspace,
// WindowKernel::kAuto) from this many decode CTAs per SM: its three launches cost a few
// microseconds of latency that the smallest calls do not hide (H200, Nemotron-H, L = 16,
// notes/cuda.md v11: faster from batch 8, about 16 CTAs per SM, with an fp32 and a bf16 state;
// slower at batch 1).
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

template <typename S, typename Act> struct TypedLaunch {
  static void run(const Mamba2Params& p, RowLayoutKind k, int rows, int, cudaStream_t stream) {
    launch_state_update<S, Act>(p, k, rows, stream);
  }
  static void run(const ReplayParams& p, RowLayoutKind k, int rows, int flush_rows, cudaStream_t stream) {
    launch_replay_decode<S, Act>(p, k, rows, flush_rows, stream);
  }
};

// flush_rows_per_cta: the split path's flush kernel (replay with a workspace only).
template <typename Params>
void launch(const Params& p, RowLayoutKind kind, int rows_per_cta, int flush_rows_per_cta,
            cudaStream_t stream) {
  auto with_act = [&](auto state_tag) {
    using S = decltype(state_tag);
    switch (p.act_dtype) {
      case DType::kFloat16: return TypedLaunch<S, Half>::run(p, kind, rows_per_cta, flush_rows_per_cta, stream);
      case DType::kBFloat16: return TypedLaunch<S, BFloat16>::run(p, kind, rows_per_cta, flush_rows_per_cta, stream);
      default: return TypedLaunch<S, float>::run(p, kind, rows_per_cta, flush_rows_per_cta, stream);
    }
  };
  switch (p.state_dtype) {
    case DType::kFloat16: return with_act(Half{});
    case DType::kBFloat16: return with_act(BFloat16{});
    case DType::kInt8:  // 8-bit checkpoints: replay only (validation refuses them elsewhere)
      if constexpr (std::is_same_v<Params, ReplayParams>) return with_act(Int8{});
      break;
    case DType::kFloat8E4M3:
      if constexpr (std::is_same_v<Params, ReplayParams>) return with_act(Float8E4M3{});
      break;
    default: return with_act(float{});
  }
}

// The shared memory (static and dynamic) of the split path's flush kernel: the default 48 KiB
// wherever a batch of rows fits it, as measured; past that (long buffers: its window's widened B
// alone is L x N floats, so an fp32 N = 128 state past L = 46), what a batch of rows needs.
int64_t flush_smem_limit(const ReplayParams& p, RowLayoutKind kind) {
  const int64_t s = dtype_size(p.state_dtype);
  const RowLayout l = make_row_layout(int(s), kind);
  return std::max(kMaxSharedBytes,
                  flush_smem_bytes(l.batch_rows, p.state_dim, s, p.buffer_len, l.lanes) + kFlushStaticBytes);
}

// The split path needs the caller's workspace and the output-only route (the state-and-output
// route forms every row's state anyway); it is compiled for the vectorised layouts and for
// rounding to nearest, its window kernel moves x, z, the cached x and the outputs in packs of
// window_rows_per_thread() head_dim rows, and its flush kernel's window must fit the device's
// shared memory.
bool uses_window_kernel(const ReplayParams& p, RowLayoutKind kind, int rows_per_cta,
                        const LaunchConfig& config) {
  const WindowKernel choice = config.window_kernel < 0 ? p.window_kernel
                              : config.window_kernel == 0 ? WindowKernel::kFused
                                                          : WindowKernel::kSeparate;
  if (!p.workspace || p.route == ReplayRoute::kStateAndOutput || p.stochastic_rounding ||
      kind == RowLayoutKind::kGeneric || choice == WindowKernel::kFused)
    return false;
  if (choice == WindowKernel::kAuto) {  // where the dot kernel can take the window, from where it stops
    const int64_t dot_ctas = dot_window_ctas(p, kind);
    if (dot_ctas ? dot_ctas < kDotWindowMaxCtasPerSm * sm_count()
                 : ctas_for(p, rows_per_cta) < kWindowKernelMinCtasPerSm * sm_count())
      return false;
  }
  const int rows = window_rows_per_thread(p);
  const int64_t a = dtype_size(p.act_dtype), pack = rows * a;
  const bool packed = p.head_dim % rows == 0 &&
                      aligned(p.x, a, pack, {p.x_stride_batch, p.x_stride_head}) &&
                      (!p.z || aligned(p.z, a, pack, {p.z_stride_batch, p.z_stride_head})) &&
                      aligned(p.out, a, pack, {p.out_stride_batch, p.out_stride_head}) &&
                      aligned(p.x_cache, a, pack, {p.xc_stride_slot, p.xc_stride_head, p.xc_stride_pos});
  return packed && window_heads(p.heads_per_group, p.head_dim, rows) > 0 &&
         flush_smem_limit(p, kind) <= max_shared_bytes_per_cta();
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
  return LaunchConfig{decode_rows_per_cta(p, nullptr, choose_layout(p, nullptr), LaunchConfig{})};
}

LaunchConfig auto_launch_config(const ReplayParams& p) {
  return LaunchConfig{decode_rows_per_cta(p, &p, choose_layout(p, &p), LaunchConfig{})};
}

void selective_state_update(const Mamba2Params& p, const LaunchConfig& config, void* stream) {
  const ScopedDevice on_device(p.device_index);
  const RowLayoutKind kind = choose_layout(p, nullptr);
  const int rows = decode_rows_per_cta(p, nullptr, kind, config);
  if (p.batch == 0) return;
  launch(p, kind, rows, 0, static_cast<cudaStream_t>(stream));
}

void replay_decode(const ReplayParams& p, const LaunchConfig& config, void* stream) {
  const ScopedDevice on_device(p.device_index);
  const RowLayoutKind kind = choose_layout(p, &p);
  const int rows = decode_rows_per_cta(p, &p, kind, config);
  if (p.batch == 0) return;
  ReplayParams run = p;
  int flush_rows = 0;
  if (uses_window_kernel(p, kind, rows, config)) {
    const int64_t s = dtype_size(p.state_dtype);
    const int lanes = make_row_layout(int(s), kind).lanes;
    flush_rows = rows_per_cta_for(p, kind, rows, 0, flush_smem_limit(p, kind) - kFlushStaticBytes, [&](int64_t r) {
      return flush_smem_bytes(r, p.state_dim, s, p.buffer_len, lanes);
    });
  } else {
    run.workspace = nullptr;
  }
  launch(run, kind, rows, flush_rows, static_cast<cudaStream_t>(stream));
  if (p.stochastic_rounding) {
    const unsigned blocks = unsigned((p.batch + kCursorThreads - 1) / kCursorThreads);
    count_flushes_kernel<<<blocks, kCursorThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
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
