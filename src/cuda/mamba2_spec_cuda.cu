// Host side of the speculative CUDA backend: picks the launch, dispatches on the dtypes, and runs
// the ring kernels.
#include "cuda/mamba2_spec_cuda.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/check.hpp"
#include "cuda/mamba2_spec_launch.hpp"

namespace replayssm::cuda {
namespace {

// Head_dim rows per CTA shrink (to more, shorter CTAs) until the grid has this many CTAs per SM.
constexpr int64_t kTargetCtasPerSm = 8;
constexpr int kMaxRowsPerCta = 64;
constexpr int kMinRowsPerCta = 4;  // one row per warp
constexpr int kRingThreads = 256;
constexpr int64_t kMaxGridRows = 65535;  // batch rows run along the grid's y axis

int device_attribute(cudaDeviceAttr attribute) {
  int device = 0, value = 0;
  REPLAYSSM_CUDA_CHECK(cudaGetDevice(&device));
  REPLAYSSM_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  return value;
}

std::string text(int64_t v) { return std::to_string(v); }

// rows_per_cta from the batch and the device, the shared memory it needs checked against the
// device's; 16-byte state accesses when every state row is 16-byte aligned.
template <typename Params>
SpecLaunch choose_launch(const Params& p, int64_t (*smem_bytes)(const Params&, int)) {
  if (p.state_dim > kMaxSpecStateDim)
    throw InvalidArgument("replayssm: state.size(3)=" + text(p.state_dim) + " (state_dim) exceeds " +
                          text(kMaxSpecStateDim) + ", the largest state_dim the CUDA speculative kernels support");
  if (p.batch > kMaxGridRows)
    throw InvalidArgument("replayssm: batch=" + text(p.batch) +
                          " exceeds the CUDA grid: the CUDA backend takes at most " + text(kMaxGridRows) +
                          " rows a call");
  SpecLaunch l;
  l.rows_per_cta = int(std::min<int64_t>(p.head_dim, kMaxRowsPerCta));
  auto ctas = [&](int rows) { return p.nheads * ((p.head_dim + rows - 1) / rows); };
  const int64_t target = kTargetCtasPerSm * device_attribute(cudaDevAttrMultiProcessorCount);
  while (l.rows_per_cta > kMinRowsPerCta && p.batch * ctas(l.rows_per_cta) < target) l.rows_per_cta /= 2;
  l.rows_per_cta = std::max(l.rows_per_cta, std::min<int>(kMinRowsPerCta, int(p.head_dim)));
  l.ctas_per_row = ctas(l.rows_per_cta);
  const int64_t smem = smem_bytes(p, l.rows_per_cta);
  const int64_t limit = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  if (smem > limit)
    throw InvalidArgument("replayssm: the CUDA speculative kernels need " + text(smem) +
                          " bytes of shared memory per CTA for this buffer_len, window and state_dim, " +
                          "more than the device's " + text(limit));
  const int64_t s = dtype_size(p.state_dtype), vec = 16 / s;
  l.vectorised = p.state_dim % vec == 0 && reinterpret_cast<uintptr_t>(p.state) % 16 == 0 &&
                 (p.state_stride_slot * s) % 16 == 0 && (p.state_stride_head * s) % 16 == 0 &&
                 (p.state_stride_p * s) % 16 == 0;
  return l;
}

template <template <typename, typename> class Launch, typename Params>
void dispatch(const Params& p, const SpecLaunch& l, cudaStream_t stream) {
  auto with_act = [&](auto state_tag) {
    using S = decltype(state_tag);
    switch (p.act_dtype) {
      case DType::kFloat16: return Launch<S, Half>::run(p, l, stream);
      case DType::kBFloat16: return Launch<S, BFloat16>::run(p, l, stream);
      default: return Launch<S, float>::run(p, l, stream);
    }
  };
  switch (p.state_dtype) {
    case DType::kFloat16: return with_act(Half{});
    case DType::kBFloat16: return with_act(BFloat16{});
    default: return with_act(float{});
  }
}

template <typename S, typename Act> struct Verify {
  static void run(const SpecVerifyParams& p, const SpecLaunch& l, cudaStream_t s) {
    launch_spec_verify<S, Act>(p, l, s);
  }
};
template <typename S, typename Act> struct Baseline {
  static void run(const SpecBaselineParams& p, const SpecLaunch& l, cudaStream_t s) {
    launch_spec_baseline<S, Act>(p, l, s);
  }
};

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
  const SpecLaunch l = choose_launch(p, spec_verify_smem_bytes);
  if (p.batch == 0) return;
  dispatch<Verify>(p, l, static_cast<cudaStream_t>(stream));
}

void spec_state_update(const SpecBaselineParams& p, void* stream) {
  const ScopedDevice on_device(p.device_index);
  const SpecLaunch l = choose_launch(p, spec_baseline_smem_bytes);
  if (p.batch == 0) return;
  dispatch<Baseline>(p, l, static_cast<cudaStream_t>(stream));
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
