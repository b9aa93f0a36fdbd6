#include "cuda/launch_shape.hpp"

#include <algorithm>
#include <atomic>
#include <climits>
#include <string>

#include "cuda/check.hpp"

namespace replayssm::cuda {
namespace {

constexpr int kMaxDevices = 64;
constexpr int64_t kMaxGridRows = 65535;  // batch rows run along the grid's y axis

int64_t round_up(int64_t v, int64_t multiple) { return (v + multiple - 1) / multiple * multiple; }

// An attribute of the current device, read once per device into `cached`.
int device_attribute(cudaDeviceAttr attribute, std::atomic<int> (&cached)[kMaxDevices]) {
  int device = 0;
  REPLAYSSM_CUDA_CHECK(cudaGetDevice(&device));
  int value = device < kMaxDevices ? cached[device].load(std::memory_order_relaxed) : 0;
  if (value == 0) {
    REPLAYSSM_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
    if (device < kMaxDevices) cached[device].store(value, std::memory_order_relaxed);
  }
  return value;
}

}  // namespace

int sm_count() {
  static std::atomic<int> cached[kMaxDevices];
  return device_attribute(cudaDevAttrMultiProcessorCount, cached);
}

int64_t shared_bytes_per_cta(int ctas_per_sm) {
  static std::atomic<int> per_sm[kMaxDevices], reserved[kMaxDevices];
  return device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor, per_sm) / ctas_per_sm -
         device_attribute(cudaDevAttrReservedSharedMemoryPerBlock, reserved);
}

int64_t max_shared_bytes_per_cta() {
  static std::atomic<int> cached[kMaxDevices];
  return device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, cached);
}

bool aligned(const void* ptr, int64_t element_bytes, int64_t alignment,
             std::initializer_list<int64_t> strides) {
  if (reinterpret_cast<uintptr_t>(ptr) % uintptr_t(alignment) != 0) return false;
  for (int64_t s : strides)
    if (s * element_bytes % alignment != 0) return false;
  return true;
}

int64_t slice_access_bytes(const Mamba2Params& p, RowLayoutKind kind) {
  return std::min<int64_t>(16, make_row_layout(int(dtype_size(p.state_dtype)), kind).vec *
                                   dtype_size(p.act_dtype));
}

RowLayoutKind vectorised_layout(const Mamba2Params& p) {
  if (p.state_dim > kMaxStateDim)
    throw InvalidArgument("replayssm: state.size(3)=" + std::to_string(p.state_dim) +
                          " (state_dim) exceeds " + std::to_string(kMaxStateDim) +
                          ", the largest state_dim the CUDA backend supports");
  RowLayoutKind kind = RowLayoutKind::kGeneric;
  if (p.state_dim == 64) kind = RowLayoutKind::kN64;
  if (p.state_dim == 128) kind = RowLayoutKind::kN128;
  if (p.state_dim == 256) kind = RowLayoutKind::kN256;
  if (kind == RowLayoutKind::kGeneric) return kind;
  const int64_t s = dtype_size(p.state_dtype), a = dtype_size(p.act_dtype);
  const int64_t slice = slice_access_bytes(p, kind);
  const bool ok = aligned(p.state, s, 16, {p.state_stride_slot, p.state_stride_head, p.state_stride_p}) &&
                  aligned(p.B, a, slice, {p.B_stride_batch, p.B_stride_group}) &&
                  aligned(p.C, a, slice, {p.C_stride_batch, p.C_stride_group});
  return ok ? kind : RowLayoutKind::kGeneric;
}

int window_rows_per_thread(const ReplayParams& p) {
  const int heads = window_heads(p.heads_per_group, p.head_dim, kWindowRowsMany);
  if (p.head_dim % kWindowRowsMany != 0 || heads == 0) return kWindowRowsFew;
  const int64_t ctas = p.batch * p.ngroups * ((p.heads_per_group + heads - 1) / heads);
  return ctas >= kWindowRowsManyCtasPerSm * sm_count() ? kWindowRowsMany : kWindowRowsFew;
}

bool window_one_round(const ReplayParams& p, int64_t ctas, int64_t threads, int rows, int part_rows) {
  const int64_t smem = window_smem_bytes(threads, rows, dtype_size(p.act_dtype), p.buffer_len, p.state_dim, true);
  return part_rows > 0 && ctas <= kWindowOneRoundCtasPerSm * sm_count() &&
         smem + kWindowStaticBytes <= shared_bytes_per_cta(kWindowOneRoundCtasPerSm);
}

int64_t ctas_for(const Mamba2Params& p, int64_t rows_per_cta) {
  return p.batch * p.nheads * ((p.head_dim + rows_per_cta - 1) / rows_per_cta);
}

int rows_per_cta_for(const Mamba2Params& p, RowLayoutKind kind, int64_t requested,
                     int64_t target_ctas_per_sm, int64_t smem_limit,
                     const std::function<int64_t(int64_t)>& smem_bytes) {
  const RowLayout l = make_row_layout(int(dtype_size(p.state_dtype)), kind);
  int64_t rows = round_up(std::min<int64_t>(p.head_dim, kMaxRowsPerCta), l.batch_rows);
  if (requested > 0) rows = std::min(rows, round_up(requested, l.batch_rows));
  auto smaller = [&](int64_t r) { return std::max<int64_t>(l.batch_rows, round_up(r / 2, l.batch_rows)); };
  while (rows > l.batch_rows && smem_bytes(rows) > smem_limit) rows = smaller(rows);
  if (smem_bytes(rows) > smem_limit)
    throw InvalidArgument("replayssm: the CUDA kernels need " + std::to_string(smem_bytes(rows)) +
                          " bytes of shared memory per CTA for these dims (state_dim=" +
                          std::to_string(p.state_dim) + "), more than " + std::to_string(smem_limit));
  if (requested <= 0) {
    const int64_t target = target_ctas_per_sm * sm_count();
    while (rows > l.batch_rows && ctas_for(p, rows) < target) rows = smaller(rows);
  }
  const int64_t head_ctas = p.nheads * ((p.head_dim + rows - 1) / rows);
  if (p.batch > kMaxGridRows || head_ctas > INT_MAX)
    throw InvalidArgument("replayssm: batch=" + std::to_string(p.batch) + " and nheads=" +
                          std::to_string(p.nheads) + " exceed the CUDA grid: the CUDA backend takes " +
                          "at most " + std::to_string(kMaxGridRows) + " rows a call");
  return int(rows);
}

}  // namespace replayssm::cuda
