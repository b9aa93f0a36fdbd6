// Host side of the speculative CUDA backend: picks the row layout and the rows per CTA (as standard
// decode does), dispatches on the dtypes, and runs the ring kernels.
#include "cuda/mamba2_spec_cuda.hpp"

#include <algorithm>
#include <cstdint>

#include "cuda/check.hpp"
#include "cuda/launch_shape.hpp"
#include "cuda/mamba2_spec_launch.hpp"

namespace replayssm::cuda {
namespace {

// Whole heads per CTA unless that leaves fewer than this many CTAs per SM, as in standard decode.
constexpr int64_t kTargetCtasPerSm = 16;
// The split path (a workspace, WindowKernel::kAuto) from this many verify CTAs per SM: below, the
// latency of its three launches is not hidden (Nemotron-H on an H100: the fused kernel faster at
// batch 2, the split path from batch 3; notes/spec.md, v62).
constexpr int64_t kSplitMinCtasPerSm = 5;
constexpr int kRingThreads = 256;

// The layout of standard decode (launch_shape.hpp), kept only if the window's token strides of B
// and C (and the B ring, for verify) keep its slice accesses aligned.
RowLayoutKind spec_layout(const WindowParams& p, const SpecVerifyParams* verify) {
  const RowLayoutKind kind = vectorised_layout(p);
  if (kind == RowLayoutKind::kGeneric) return kind;
  const int64_t a = dtype_size(p.act_dtype), slice = slice_access_bytes(p, kind);
  bool ok = aligned(p.B, a, slice, {p.B_stride_token}) && aligned(p.C, a, slice, {p.C_stride_token});
  if (verify)
    ok = ok && aligned(verify->B_cache, a, slice,
                       {verify->Bc_stride_slot, verify->Bc_stride_group, verify->Bc_stride_pos});
  return ok ? kind : RowLayoutKind::kGeneric;
}

// x staged by 16-byte accesses: every row of x in the window and in the ring, and every chunk of
// rows_per_cta rows (the chunks are whole vectors), starts 16-byte aligned.
bool x_slices(const SpecVerifyParams& p, int rows_per_cta) {
  const int64_t a = dtype_size(p.act_dtype), vec = 16 / a;
  return rows_per_cta % vec == 0 && p.head_dim % vec == 0 &&
         aligned(p.x, a, 16, {p.x_stride_batch, p.x_stride_head, p.x_stride_token}) &&
         aligned(p.x_cache, a, 16, {p.xc_stride_slot, p.xc_stride_head, p.xc_stride_pos});
}

// The split path needs the caller's workspace and a vectorised layout; its window kernel moves x,
// z, the cached x and the outputs in packs of kSpecWindowRowsMany head_dim rows (or of
// kSpecWindowRowsFew, which those alignments cover) and B in pieces of 4 elements.
bool uses_split_path(const SpecVerifyParams& p, RowLayoutKind kind, int rows_per_cta) {
  if (!p.workspace || kind == RowLayoutKind::kGeneric || p.window_kernel == WindowKernel::kFused) return false;
  if (p.window_kernel == WindowKernel::kAuto && ctas_for(p, rows_per_cta) < kSplitMinCtasPerSm * sm_count())
    return false;
  const int64_t a = dtype_size(p.act_dtype), pack = kSpecWindowRowsMany * a;
  const int heads = window_heads(p.heads_per_group, p.head_dim, kSpecWindowRowsMany);
  return p.head_dim % kSpecWindowRowsMany == 0 && heads > 0 &&
         aligned(p.x, a, pack, {p.x_stride_batch, p.x_stride_token, p.x_stride_head}) &&
         (!p.z || aligned(p.z, a, pack, {p.z_stride_batch, p.z_stride_token, p.z_stride_head})) &&
         aligned(p.out, a, pack, {p.out_stride_batch, p.out_stride_token, p.out_stride_head}) &&
         aligned(p.x_cache, a, pack, {p.xc_stride_slot, p.xc_stride_head, p.xc_stride_pos}) &&
         aligned(p.B, a, 4 * a, {p.B_stride_batch, p.B_stride_token, p.B_stride_group}) &&
         aligned(p.B_cache, a, 4 * a, {p.Bc_stride_slot, p.Bc_stride_group, p.Bc_stride_pos});
}

// The shared memory a verify CTA (the fused kernel, or the split path's flush kernel) keeps to:
// kSpecMaxSharedBytes, or what a batch of rows needs where that is more (long buffers of wide
// states: the window's widened B alone is L x N floats, 64 KiB for N = 256 at L = 64), up to the
// device's opt-in limit (less the flush kernel's static bytes).
int64_t verify_smem_limit(const SpecVerifyParams& p, RowLayoutKind kind) {
  const int64_t batch_rows = make_row_layout(int(dtype_size(p.state_dtype)), kind).batch_rows;
  const int64_t least = spec_verify_smem_bytes(p, kind, batch_rows);
  return std::min(std::max(kSpecMaxSharedBytes, least), max_shared_bytes_per_cta() - kFlushStaticBytes);
}

// rows: the fused kernel's rows per CTA; the split path's flush kernel takes whole heads where
// its shared memory allows.
template <typename S, typename Act> struct Verify {
  static void run(const SpecVerifyParams& p, RowLayoutKind k, int rows, cudaStream_t s) {
    if (!uses_split_path(p, k, rows)) return launch_spec_verify<S, Act>(p, k, rows, x_slices(p, rows), s);
    const int flush_rows = rows_per_cta_for(p, k, 0, 0, verify_smem_limit(p, k), [&](int64_t r) {
      return spec_verify_smem_bytes(p, k, r);
    });
    launch_spec_split<S, Act>(p, k, flush_rows, x_slices(p, flush_rows), s);
  }
};
template <typename S, typename Act> struct Baseline {
  static void run(const SpecBaselineParams& p, RowLayoutKind k, int rows, cudaStream_t s) {
    launch_spec_baseline<S, Act>(p, k, rows, s);
  }
};

template <template <typename, typename> class Launch, typename Params>
void dispatch(const Params& p, RowLayoutKind kind, int rows, cudaStream_t stream) {
  auto with_act = [&](auto state_tag) {
    using S = decltype(state_tag);
    switch (p.act_dtype) {
      case DType::kFloat16: return Launch<S, Half>::run(p, kind, rows, stream);
      case DType::kBFloat16: return Launch<S, BFloat16>::run(p, kind, rows, stream);
      default: return Launch<S, float>::run(p, kind, rows, stream);
    }
  };
  switch (p.state_dtype) {
    case DType::kFloat16: return with_act(Half{});
    case DType::kBFloat16: return with_act(BFloat16{});
    default: return with_act(float{});
  }
}

__device__ int64_t ring_slot(const SpecRingParams& p, int64_t i) {
  if (p.slot_ids == nullptr) return i;
  const int64_t slot = p.slot_ids[i * p.slot_ids_stride];
  return slot == p.pad_slot_id ? -1 : slot;
}

__global__ void commit_kernel(const SpecRingParams p) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.count) return;
  const int64_t slot = ring_slot(p, i);
  if (slot < 0 || slot >= p.slots) return;
  const int32_t k = p.num_accepted_tokens[i * p.num_accepted_tokens_stride];
  int32_t* ring = p.ring + slot * p.ring_stride_slot;
  const RingEntry now{ring[0], ring[p.ring_stride_field]};
  if (k < 1 || k > p.window || now.committed < 0 || now.committed > p.buffer_len - p.window) return;
  const RingEntry next = committed_ring(now, k, p.window, p.buffer_len, p.ring_len);
  ring[0] = next.origin;
  ring[p.ring_stride_field] = next.committed;
}

__global__ void reset_kernel(const SpecRingParams p) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.count) return;
  const int64_t slot = ring_slot(p, i);
  if (slot < 0 || slot >= p.slots) return;
  int32_t* ring = p.ring + slot * p.ring_stride_slot;
  ring[0] = 0;
  ring[p.ring_stride_field] = 0;
}

unsigned ring_grid(const SpecRingParams& p) { return unsigned((p.count + kRingThreads - 1) / kRingThreads); }

}  // namespace

void spec_verify(const SpecVerifyParams& p, void* stream) {
  const ScopedDevice on_device(p.device_index);
  const RowLayoutKind kind = spec_layout(p, &p);
  const int rows = rows_per_cta_for(p, kind, 0, kTargetCtasPerSm, verify_smem_limit(p, kind), [&](int64_t r) {
    return spec_verify_smem_bytes(p, kind, r);
  });
  if (p.batch == 0) return;
  dispatch<Verify>(p, kind, rows, static_cast<cudaStream_t>(stream));
}

void spec_state_update(const SpecBaselineParams& p, void* stream) {
  const ScopedDevice on_device(p.device_index);
  const RowLayoutKind kind = spec_layout(p, nullptr);
  const int rows = rows_per_cta_for(p, kind, 0, kTargetCtasPerSm, kSpecMaxSharedBytes, [&](int64_t r) {
    return spec_baseline_smem_bytes(p, kind, r);
  });
  if (p.batch == 0) return;
  dispatch<Baseline>(p, kind, rows, static_cast<cudaStream_t>(stream));
}

void spec_commit(const SpecRingParams& p, void* stream) {
  if (p.count == 0) return;
  const ScopedDevice on_device(p.device_index);
  commit_kernel<<<ring_grid(p), kRingThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  REPLAYSSM_CUDA_CHECK(cudaGetLastError());
}

void spec_reset(const SpecRingParams& p, void* stream) {
  if (p.count == 0) return;
  const ScopedDevice on_device(p.device_index);
  reset_kernel<<<ring_grid(p), kRingThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  REPLAYSSM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace replayssm::cuda
