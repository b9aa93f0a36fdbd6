// Speculative decoding kernels: ReplaySSM verify and the baseline speculative path. Included by
// the per-state-dtype instantiation files (mamba2_spec_*.cu) only.
//
// One CTA handles one (row, head, chunk of head_dim rows); each warp takes one state row at a
// time, its lanes holding the row's state_dim columns in registers (16-byte loads where the
// layout allows it). The state is read once per verify step; only flush rows (ReplaySSM) and the
// T positions (baseline) write it. Everything a row's tokens share (their B, the window's C, the
// weights) is staged in shared memory once per CTA.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "api/spec_params.hpp"
#include "common/mamba2_math.hpp"
#include "cuda/check.hpp"
#include "cuda/mamba2_spec_launch.hpp"

namespace replayssm::cuda::spec {

constexpr int kWarps = kSpecThreads / 32;

template <typename T> __device__ __forceinline__ const T* at(const void* base, int64_t offset) {
  return static_cast<const T*>(base) + offset;
}
template <typename T> __device__ __forceinline__ T* at(void* base, int64_t offset) {
  return static_cast<T*>(base) + offset;
}

__device__ __forceinline__ float head_value(const HeadScalar& s, int64_t h, float absent) {
  return s.data ? load_as<float>(s.data, s.dtype, h * s.stride) : absent;
}

// VEC consecutive elements widened to fp32: one 16-byte load when VEC elements make 16 bytes.
template <int VEC, typename S> __device__ __forceinline__ void load_vec(const S* src, float* dst) {
  if constexpr (VEC * sizeof(S) == 16) {
    const uint4 raw = *reinterpret_cast<const uint4*>(src);
    const S* e = reinterpret_cast<const S*>(&raw);
#pragma unroll
    for (int v = 0; v < VEC; ++v) dst[v] = to_float(e[v]);
  } else {
#pragma unroll
    for (int v = 0; v < VEC; ++v) dst[v] = to_float(src[v]);
  }
}

// Rounds VEC values to S, stores them, and returns in `values` what was stored.
template <int VEC, typename S> __device__ __forceinline__ void store_vec(float* values, S* dst) {
  if constexpr (VEC * sizeof(S) == 16) {
    uint4 raw;
    S* e = reinterpret_cast<S*>(&raw);
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      e[v] = from_float<S>(values[v]);
      values[v] = to_float(e[v]);
    }
    *reinterpret_cast<uint4*>(dst) = raw;
  } else {
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      dst[v] = from_float<S>(values[v]);
      values[v] = to_float(dst[v]);
    }
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The warp sums of eight values at once, by a transposing butterfly: at each of the first three
// levels a lane keeps half of its values and trades the other half, so that 9 shuffles replace
// 40. Returns the sum of value (lane >> 2) & 7, held by lanes 4u .. 4u + 3 for value u.
__device__ __forceinline__ float warp_sums8(float (&v)[kMaxSpecWindow], int lane) {
  static_assert(kMaxSpecWindow == 8, "the butterfly trades halves of eight values");
#pragma unroll
  for (int half = 4, offset = 16; half >= 1; half >>= 1, offset >>= 1) {
    const bool upper = lane & offset;
#pragma unroll
    for (int k = 0; k < half; ++k) {
      const float received = __shfl_xor_sync(0xffffffffu, upper ? v[k] : v[k + half], offset);
      v[k] = (upper ? v[k + half] : v[k]) + received;
    }
  }
  float sum = v[0];
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  return sum;
}

// The columns of a state row a lane holds: CHUNKS groups of VEC, chunk k starting at
// k * 32 * VEC + lane * VEC.
template <int VEC, int CHUNKS> struct RowSlice {
  float v[CHUNKS][VEC];

  __device__ __forceinline__ static int64_t column(int k, int lane) { return int64_t(k) * 32 * VEC + lane * VEC; }

  template <typename S> __device__ __forceinline__ void load(const S* row, int64_t N, int lane) {
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k) {
      const int64_t c = column(k, lane);
      if (c < N) {
        load_vec<VEC>(row + c, v[k]);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) v[k][e] = 0.f;
      }
    }
  }
  template <typename S> __device__ __forceinline__ void store(S* row, int64_t N, int lane) {
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k)
      if (column(k, lane) < N) store_vec<VEC>(v[k], row + column(k, lane));
  }
  // v = decay v + a b, b (N) fp32 in shared memory.
  __device__ __forceinline__ void decay_add(float decay, float a, const float* b, int64_t N, int lane) {
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k) {
      const int64_t c = column(k, lane);
      if (c < N)
#pragma unroll
        for (int e = 0; e < VEC; ++e) v[k][e] = decay * v[k][e] + a * b[c + e];
    }
  }
  // This lane's share of the row dotted with b (N) fp32 in shared memory.
  __device__ __forceinline__ float dot(const float* b, int64_t N, int lane) const {
    float acc = 0.f;
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k) {
      const int64_t c = column(k, lane);
      if (c < N)
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc += v[k][e] * b[c + e];
    }
    return acc;
  }
};

// The (head, first head_dim row) of this CTA.
struct CtaRows {
  int64_t h, i_begin, i_end;
};

__device__ __forceinline__ CtaRows cta_rows(int64_t P, int rows_per_cta) {
  const int64_t chunks = (P + rows_per_cta - 1) / rows_per_cta;
  CtaRows r;
  r.h = blockIdx.x / chunks;
  r.i_begin = blockIdx.x % chunks * rows_per_cta;
  r.i_end = min(P, r.i_begin + rows_per_cta);
  return r;
}

// out[row, t, h, i] = (y + D x) * silu(z).
template <typename Act>
__device__ __forceinline__ void write_out(const WindowParams& p, int64_t row, int64_t t, int64_t h, int64_t i,
                                          float y, float x, float D) {
  float v = y + D * x;
  if (p.z)
    v *= silu(to_float(*at<Act>(p.z, row * p.z_stride_batch + t * p.z_stride_token + h * p.z_stride_head + i)));
  *at<Act>(p.out, row * p.out_stride_batch + t * p.out_stride_token + h * p.out_stride_head + i) = from_float<Act>(v);
}

// ReplaySSM verify. Token j of a row: j < c the committed inputs in the ring, then the window.
// Output t sees tokens [first, c + t], where first = c on a flush row (whose checkpoint has just
// absorbed the committed inputs) and 0 otherwise:
//   y_t = decay_t (S C_t) + sum_j weight_{j,t} (B_j . C_t) x_j
template <typename S, typename Act, int VEC, int CHUNKS>
__global__ void __launch_bounds__(kSpecThreads) verify_kernel(const SpecVerifyParams p, int rows_per_cta) {
  const int64_t row = blockIdx.y;
  const int64_t slot = slot_of_row(p, row);
  if (slot < 0 || slot >= p.slots) return;
  const int32_t* ring = p.ring + slot * p.ring_stride_slot;
  const int64_t origin = ring[0], committed = ring[p.ring_stride_field];
  const int64_t T = p.window, L = p.buffer_len, N = p.state_dim, mask = p.ring_len - 1;
  const int64_t n = valid_tokens(p, row);
  if (origin < 0 || origin > mask || committed < 0 || committed > L - T || n < 1 || n > T) return;
  const bool flush = spec_flushes(committed, T, L);
  const int64_t first = flush ? committed : 0, count = committed + n;
  const CtaRows cr = cta_rows(p.head_dim, rows_per_cta);
  const int64_t h = cr.h, g = h / p.heads_per_group, rows = cr.i_end - cr.i_begin;
  const int64_t act = sizeof(Act);

  extern __shared__ float smem[];
  float* Bs = smem;                     // (L, N): B of every token
  float* Cs = Bs + L * N;               // (T, N): C of every window position
  float* xs = Cs + T * N;               // (L, rows_per_cta): x of every token, this CTA's rows
  float* coef = xs + L * rows_per_cta;  // (T, L): weight_{j,t} (B_j . C_t)
  float* raw_dt = coef + T * L;         // (L)
  float* fold_weight = raw_dt + L;      // (L): weights of the committed inputs at a flush
  float* decay = fold_weight + L;       // (T + 1): decay_t, then the fold's decay

  // Token j's inputs: the ring below c, the window from c on.
  const char* B_ring = static_cast<const char*>(p.B_cache) + (slot * p.Bc_stride_slot + g * p.Bc_stride_group) * act;
  Act* x_ring = at<Act>(p.x_cache, slot * p.xc_stride_slot + h * p.xc_stride_head);
  float* dt_ring = p.dt_cache + slot * p.dtc_stride_slot + h * p.dtc_stride_head;
  auto B_of = [&](int64_t j) -> const Act* {
    if (j < committed) return reinterpret_cast<const Act*>(B_ring + ((origin + j) & mask) * p.Bc_stride_pos * act);
    return at<Act>(p.B, row * p.B_stride_batch + (j - committed) * p.B_stride_token + g * p.B_stride_group);
  };
  auto x_of = [&](int64_t j) -> const Act* {
    if (j < committed) return x_ring + ((origin + j) & mask) * p.xc_stride_pos;
    return at<Act>(p.x, row * p.x_stride_batch + (j - committed) * p.x_stride_token + h * p.x_stride_head);
  };

  for (int64_t e = threadIdx.x; e < count * N; e += blockDim.x) Bs[e] = to_float(B_of(e / N)[e % N]);
  for (int64_t e = threadIdx.x; e < n * N; e += blockDim.x)
    Cs[e] = to_float(*at<Act>(p.C, row * p.C_stride_batch + e / N * p.C_stride_token + g * p.C_stride_group + e % N));
  for (int64_t e = threadIdx.x; e < count * rows; e += blockDim.x)
    xs[e / rows * rows_per_cta + e % rows] = to_float(x_of(e / rows)[cr.i_begin + e % rows]);
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x)
    raw_dt[j] = j < committed ? dt_ring[(origin + j) & mask]
                              : load_as<float>(p.dt, p.dt_dtype, row * p.dt_stride_batch +
                                                                     (j - committed) * p.dt_stride_token +
                                                                     h * p.dt_stride_head);
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t e = warp; e < n * count; e += kWarps) {  // B_j . C_t, one warp per pair
    const int64_t t = e / count, j = e % count;
    if (j < first || j > committed + t) continue;
    float bc = 0.f;
    for (int64_t k = lane; k < N; k += 32) bc += Bs[j * N + k] * Cs[t * N + k];
    bc = warp_sum(bc);
    if (lane == 0) coef[t * L + j] = bc;
  }
  __syncthreads();
  // Weights by backward sums of the effective dt (no cancellation), as every backend computes them.
  const float A = head_value(p.A, h, 0.f), bias = head_value(p.dt_bias, h, 0.f);
  if (threadIdx.x < n) {
    const int64_t t = threadIdx.x;
    float later = 0.f;
    for (int64_t j = committed + t; j >= first; --j) {
      const float dt = effective_dt(raw_dt[j], bias, p.dt_softplus);
      coef[t * L + j] *= dt * expf(A * later);
      later += dt;
    }
    decay[t] = expf(A * later);
  }
  if (flush && threadIdx.x == blockDim.x - 1) {
    float later = 0.f;
    for (int64_t j = committed - 1; j >= 0; --j) {
      const float dt = effective_dt(raw_dt[j], bias, p.dt_softplus);
      fold_weight[j] = dt * expf(A * later);
      later += dt;
    }
    decay[T] = expf(A * later);
  }
  __syncthreads();

  const float D = head_value(p.D, h, 0.f);
  S* head_state = at<S>(p.state, slot * p.state_stride_slot + h * p.state_stride_head);
  // Each warp loads its next row while it works on the current one: two rows in flight.
  RowSlice<VEC, CHUNKS> next;
  if (cr.i_begin + warp < cr.i_end) next.load(head_state + (cr.i_begin + warp) * p.state_stride_p, N, lane);
  for (int64_t i = cr.i_begin + warp; i < cr.i_end; i += kWarps) {
    const int64_t r = i - cr.i_begin;
    S* state_row = head_state + i * p.state_stride_p;
    RowSlice<VEC, CHUNKS> s = next;
    if (i + kWarps < cr.i_end) next.load(state_row + kWarps * p.state_stride_p, N, lane);
    if (flush) {  // the checkpoint becomes the state after the committed inputs
      const float fold_decay = decay[T];
      for (int64_t j = 0; j < committed; ++j)
        s.decay_add(j == 0 ? fold_decay : 1.f, fold_weight[j] * xs[j * rows_per_cta + r], Bs + j * N, N, lane);
      s.store(state_row, N, lane);
    }
    float dots[kMaxSpecWindow];
#pragma unroll
    for (int t = 0; t < kMaxSpecWindow; ++t) dots[t] = t < n ? s.dot(Cs + t * N, N, lane) : 0.f;
    const float dot_t = warp_sums8(dots, lane);
    const int64_t t = lane >> 2;
    if ((lane & 3) == 0 && t < n) {
      float y = decay[t] * dot_t;
      for (int64_t j = first; j <= committed + t; ++j) y += coef[t * L + j] * xs[j * rows_per_cta + r];
      write_out<Act>(p, row, t, h, i, y, xs[(committed + t) * rows_per_cta + r], D);
    }
  }

  // Append the window, uncommitted: x of this CTA's rows; dt and B by the first chunk (B by the
  // first head of the group).
  for (int64_t e = threadIdx.x; e < n * rows; e += blockDim.x) {
    const int64_t t = e / rows, i = cr.i_begin + e % rows;
    x_ring[((origin + committed + t) & mask) * p.xc_stride_pos + i] = x_of(committed + t)[i];
  }
  if (cr.i_begin == 0) {
    for (int64_t t = threadIdx.x; t < n; t += blockDim.x)
      dt_ring[(origin + committed + t) & mask] = raw_dt[committed + t];
    if (h % p.heads_per_group == 0)
      for (int64_t e = threadIdx.x; e < n * N; e += blockDim.x) {
        const int64_t t = e / N, pos = (origin + committed + t) & mask;
        at<Act>(p.B_cache, slot * p.Bc_stride_slot + g * p.Bc_stride_group + pos * p.Bc_stride_pos)[e % N] =
            B_of(committed + t)[e % N];
      }
  }
}

// The baseline: token by token from the previous window's accepted state, each position's state
// stored (and continued from as stored) in its slot: S = exp(A dt) S + dt x B^T, y = S C.
template <typename S, typename Act, int VEC, int CHUNKS>
__global__ void __launch_bounds__(kSpecThreads) baseline_kernel(const SpecBaselineParams p, int rows_per_cta) {
  const int64_t row = blockIdx.y;
  const int64_t first_slot = slot_of_row(p, row);
  if (first_slot < 0 || first_slot >= p.slots) return;
  const int64_t T = p.window, N = p.state_dim;
  const int64_t n = valid_tokens(p, row);
  const int64_t k = p.num_accepted_tokens[row * p.num_accepted_tokens_stride];
  if (n < 1 || n > T || k < 1 || k > T) return;
  const int64_t source = baseline_slot(p, row, k - 1);
  if (source < 0 || source >= p.slots) return;
  for (int64_t t = 0; t < n; ++t)
    if (baseline_slot(p, row, t) < 0 || baseline_slot(p, row, t) >= p.slots) return;
  const CtaRows cr = cta_rows(p.head_dim, rows_per_cta);
  const int64_t h = cr.h, g = h / p.heads_per_group, rows = cr.i_end - cr.i_begin;

  extern __shared__ float smem[];
  float* Bs = smem;                     // (T, N)
  float* Cs = Bs + T * N;               // (T, N)
  float* xs = Cs + T * N;               // (T, rows_per_cta)
  float* dts = xs + T * rows_per_cta;   // (T): effective dt
  float* decays = dts + T;              // (T): exp(A dt)
  for (int64_t e = threadIdx.x; e < n * N; e += blockDim.x) {
    const int64_t t = e / N, k = e % N;
    Bs[e] = to_float(*at<Act>(p.B, row * p.B_stride_batch + t * p.B_stride_token + g * p.B_stride_group + k));
    Cs[e] = to_float(*at<Act>(p.C, row * p.C_stride_batch + t * p.C_stride_token + g * p.C_stride_group + k));
  }
  for (int64_t e = threadIdx.x; e < n * rows; e += blockDim.x) {
    const int64_t t = e / rows, i = cr.i_begin + e % rows;
    xs[t * rows_per_cta + e % rows] =
        to_float(*at<Act>(p.x, row * p.x_stride_batch + t * p.x_stride_token + h * p.x_stride_head + i));
  }
  const float A = head_value(p.A, h, 0.f);
  if (threadIdx.x < n) {
    const int64_t t = threadIdx.x;
    const float raw = load_as<float>(
        p.dt, p.dt_dtype, row * p.dt_stride_batch + t * p.dt_stride_token + h * p.dt_stride_head);
    const float dt = effective_dt(raw, head_value(p.dt_bias, h, 0.f), p.dt_softplus);
    dts[threadIdx.x] = dt;
    decays[threadIdx.x] = expf(A * dt);
  }
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float D = head_value(p.D, h, 0.f);
  const int64_t head_offset = h * p.state_stride_head;
  // Each warp loads its next row while it works on the current one: two rows in flight.
  const S* source_state = at<S>(p.state, source * p.state_stride_slot + head_offset);
  RowSlice<VEC, CHUNKS> next;
  if (cr.i_begin + warp < cr.i_end) next.load(source_state + (cr.i_begin + warp) * p.state_stride_p, N, lane);
  for (int64_t i = cr.i_begin + warp; i < cr.i_end; i += kWarps) {
    const int64_t r = i - cr.i_begin, row_offset = head_offset + i * p.state_stride_p;
    RowSlice<VEC, CHUNKS> s = next;
    if (i + kWarps < cr.i_end) next.load(source_state + (i + kWarps) * p.state_stride_p, N, lane);
    float dots[kMaxSpecWindow];
#pragma unroll
    for (int t = 0; t < kMaxSpecWindow; ++t) {
      dots[t] = 0.f;
      if (t >= n) continue;
      s.decay_add(decays[t], dts[t] * xs[t * rows_per_cta + r], Bs + t * N, N, lane);
      s.store(at<S>(p.state, baseline_slot(p, row, t) * p.state_stride_slot + row_offset), N, lane);
      dots[t] = s.dot(Cs + t * N, N, lane);
    }
    const float y = warp_sums8(dots, lane);
    const int64_t t = lane >> 2;
    if ((lane & 3) == 0 && t < n) write_out<Act>(p, row, t, h, i, y, xs[t * rows_per_cta + r], D);
  }
}

template <typename Kernel> void allow_smem(Kernel kernel, int64_t bytes) {
  if (bytes > 48 * 1024)
    REPLAYSSM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace replayssm::cuda::spec

namespace replayssm::cuda {

// Vectorised: 16-byte state accesses (VEC elements), columns up to 32 * VEC * CHUNKS; otherwise
// one element per lane and chunk.
template <typename S, typename Act>
void launch_spec_verify(const SpecVerifyParams& p, const SpecLaunch& l, cudaStream_t stream) {
  const dim3 grid(unsigned(l.ctas_per_row), unsigned(p.batch));
  const int64_t smem = spec_verify_smem_bytes(p, l.rows_per_cta);
  constexpr int kVec = int(16 / sizeof(S));
  auto run = [&](auto kernel) {
    spec::allow_smem(kernel, smem);
    kernel<<<grid, kSpecThreads, size_t(smem), stream>>>(p, l.rows_per_cta);
  };
  if (l.vectorised)
    run(spec::verify_kernel<S, Act, kVec, kMaxSpecStateDim / (32 * kVec)>);
  else
    run(spec::verify_kernel<S, Act, 1, kMaxSpecStateDim / 32>);
  REPLAYSSM_CUDA_CHECK(cudaGetLastError());
}

template <typename S, typename Act>
void launch_spec_baseline(const SpecBaselineParams& p, const SpecLaunch& l, cudaStream_t stream) {
  const dim3 grid(unsigned(l.ctas_per_row), unsigned(p.batch));
  const int64_t smem = spec_baseline_smem_bytes(p, l.rows_per_cta);
  constexpr int kVec = int(16 / sizeof(S));
  auto run = [&](auto kernel) {
    spec::allow_smem(kernel, smem);
    kernel<<<grid, kSpecThreads, size_t(smem), stream>>>(p, l.rows_per_cta);
  };
  if (l.vectorised)
    run(spec::baseline_kernel<S, Act, kVec, kMaxSpecStateDim / (32 * kVec)>);
  else
    run(spec::baseline_kernel<S, Act, 1, kMaxSpecStateDim / 32>);
  REPLAYSSM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace replayssm::cuda

// Explicit instantiations of the launchers for state type S and every activation type.
#define REPLAYSSM_INSTANTIATE_SPEC_LAUNCHER(S, Act)                                               \
  template void replayssm::cuda::launch_spec_verify<S, Act>(                                      \
      const replayssm::SpecVerifyParams&, const replayssm::cuda::SpecLaunch&, cudaStream_t);     \
  template void replayssm::cuda::launch_spec_baseline<S, Act>(                                    \
      const replayssm::SpecBaselineParams&, const replayssm::cuda::SpecLaunch&, cudaStream_t);
#define REPLAYSSM_INSTANTIATE_SPEC_LAUNCHERS(S)                 \
  REPLAYSSM_INSTANTIATE_SPEC_LAUNCHER(S, float)                 \
  REPLAYSSM_INSTANTIATE_SPEC_LAUNCHER(S, replayssm::Half)       \
  REPLAYSSM_INSTANTIATE_SPEC_LAUNCHER(S, replayssm::BFloat16)
