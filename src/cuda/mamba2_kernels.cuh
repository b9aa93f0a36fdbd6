// Mamba-2 decode kernels: the baseline selective_state_update and ReplaySSM standard decode,
// templated on the state type S, the activation type Act and the row layout (row_layout.hpp).
//
// One CTA handles one (batch row, head, chunk of head_dim rows). Its first thread starts the bulk
// copy of the chunk's state rows into shared memory (one instruction per chunk, completing on an
// mbarrier) as soon as the row's slot is known; the CTA's other loads and its window work run while
// that copy is in flight. All arithmetic is fp32 FMA on values widened from their storage type;
// nothing is rounded to 16 bits before a final store.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "api/params.hpp"
#include "common/mamba2_math.hpp"
#include "common/rounding.hpp"
#include "cuda/row_layout.hpp"

namespace replayssm::cuda {

constexpr unsigned kFullMask = 0xffffffffu;
// Registers are capped so that this many CTAs fit an SM (80 registers a thread): about as many as
// the shared memory of a whole-head fp32 tile allows.
constexpr int kMinCtasPerSm = 6;

// K consecutive elements of T moved as one access (two for 32 bytes).
template <typename T, int K>
struct alignas(sizeof(T) * K >= 16 ? 16 : sizeof(T) * K) Pack {
  T v[K];
};

template <typename T, int K> __device__ __forceinline__ Pack<T, K> load_pack(const T* p) {
  Pack<T, K> r;
  constexpr int kBytes = int(sizeof(T)) * K;
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i)
      reinterpret_cast<uint4*>(&r)[i] = __ldg(reinterpret_cast<const uint4*>(p) + i);
  } else if constexpr (kBytes == 8) {
    *reinterpret_cast<uint2*>(&r) = __ldg(reinterpret_cast<const uint2*>(p));
  } else if constexpr (kBytes == 4) {
    *reinterpret_cast<unsigned*>(&r) = __ldg(reinterpret_cast<const unsigned*>(p));
  } else if constexpr (kBytes == 2) {
    *reinterpret_cast<unsigned short*>(&r) = __ldg(reinterpret_cast<const unsigned short*>(p));
  } else {
    static_assert(kBytes == 1, "packs are 1, 2, 4, 8 or a multiple of 16 bytes");
    *reinterpret_cast<unsigned char*>(&r) = __ldg(reinterpret_cast<const unsigned char*>(p));
  }
  return r;
}

template <typename T, int K> __device__ __forceinline__ void store_pack(T* p, const Pack<T, K>& v) {
  constexpr int kBytes = int(sizeof(T)) * K;
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i)
      reinterpret_cast<uint4*>(p)[i] = reinterpret_cast<const uint4*>(&v)[i];
  } else if constexpr (kBytes == 8) {
    *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(&v);
  } else if constexpr (kBytes == 4) {
    *reinterpret_cast<unsigned*>(p) = *reinterpret_cast<const unsigned*>(&v);
  } else if constexpr (kBytes == 2) {
    *reinterpret_cast<unsigned short*>(p) = *reinterpret_cast<const unsigned short*>(&v);
  } else {
    *reinterpret_cast<unsigned char*>(p) = *reinterpret_cast<const unsigned char*>(&v);
  }
}

template <typename T> __device__ __forceinline__ T load_one(const T* p) {
  return load_pack<T, 1>(p).v[0];
}

// ---- The bulk copy engine (sm_90): global -> shared, completing on an mbarrier. ----

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return unsigned(__cvta_generic_to_shared(p));
}

// One arrival (the issuing thread's) plus the bytes of the copies completes the barrier's phase 0.
__device__ __forceinline__ void barrier_init(uint64_t* barrier) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(barrier)) : "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the init, seen by the copy engine
}

__device__ __forceinline__ void barrier_expect_bytes(uint64_t* barrier, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                   shared_address(barrier)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, unsigned bytes,
                                                    uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(barrier))
      : "memory");
}

// The waiting thread may be suspended until the phase completes (the hint: at most 1 ms) instead
// of polling.
__device__ __forceinline__ void barrier_wait(uint64_t* barrier, unsigned parity) {
  constexpr unsigned kSuspendHintNs = 1000000;
  unsigned done = 0;
  do {
    asm volatile(
        "{\n .reg .pred complete;\n"
        " mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2, %3;\n"
        " selp.u32 %0, 1, 0, complete;\n}"
        : "=r"(done)
        : "r"(shared_address(barrier)), "r"(parity), "n"(kSuspendHintNs)
        : "memory");
  } while (!done);
}

// Programmatic dependent launch (sm_90): the decode kernel of the split path is launched while
// the window kernel still runs. Both are no-ops in a kernel launched without the attribute.
__device__ __forceinline__ void allow_dependent_launch() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
// Waits until the kernel this one depends on has finished and its writes are visible.
__device__ __forceinline__ void wait_for_prior_kernel() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// The compile-time view of a RowLayout.
template <typename S, RowLayoutKind kKind> struct Layout {
  static constexpr RowLayout kSpec = make_row_layout(int(sizeof(S)), kKind);
  static constexpr bool kMasked = kKind == RowLayoutKind::kGeneric;  // check n < N per element
  static constexpr int kVec = kSpec.vec;
  static constexpr int kLanes = kSpec.lanes;
  static constexpr int kVecsPerLane = kSpec.vecs_per_lane;
  static constexpr int kRows = kSpec.rows;
  static constexpr int kRowGroups = kSpec.row_groups;
  static constexpr int kBatchRows = kSpec.batch_rows;
  static constexpr int kCoverN = kSpec.cover_n;
};

// Lane k < kRows of each row group finishes row k of the batch (the reduction left every lane of
// the group with all kRows sums): out_i = (y_i + D x_i) * silu(z_i), rounded to Act. x and z hold
// the chunk's rows.
template <typename Ly, typename Act>
__device__ __forceinline__ void store_outputs(Act* out, const float (&y)[Ly::kRows], int batch,
                                              int group, int lane, int rows, float D,
                                              const float* x, const float* z) {
  float mine = y[0];
#pragma unroll
  for (int k = 1; k < Ly::kRows; ++k) {
    if (lane == k) mine = y[k];
  }
  const int i = batch * Ly::kBatchRows + lane * Ly::kRowGroups + group;
  if (lane < Ly::kRows && i < rows) {
    float v = mine + D * x[i];
    if (z) v *= silu(z[i]);
    out[i] = from_float<Act>(v);
  }
}

// Sum over the kLanes lanes of a row group; every lane gets the sum. All 32 lanes must call it.
template <int kLanes, int kCount> __device__ __forceinline__ void row_group_sums(float (&v)[kCount]) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
#pragma unroll
    for (int k = 0; k < kCount; ++k) v[k] += __shfl_xor_sync(kFullMask, v[k], offset);
  }
}

template <typename Ly> __device__ __forceinline__ int first_element(int v, int lane) {
  return (v * Ly::kLanes + lane) * Ly::kVec;
}

// This lane's slice of an N-vector of type T (B or C), as stored; zero past N.
template <typename Ly, typename T>
__device__ __forceinline__ void load_slice_packs(const T* src, int lane, int64_t N,
                                                 Pack<T, Ly::kVec> (&out)[Ly::kVecsPerLane]) {
#pragma unroll
  for (int v = 0; v < Ly::kVecsPerLane; ++v) {
    const int n = first_element<Ly>(v, lane);
    out[v] = !Ly::kMasked || n < N ? load_pack<T, Ly::kVec>(src + n) : Pack<T, Ly::kVec>{};
  }
}

template <typename Ly, typename T>
__device__ __forceinline__ void widen_slice(const Pack<T, Ly::kVec> (&in)[Ly::kVecsPerLane],
                                            float (&out)[Ly::kVecsPerLane][Ly::kVec]) {
#pragma unroll
  for (int v = 0; v < Ly::kVecsPerLane; ++v) {
#pragma unroll
    for (int e = 0; e < Ly::kVec; ++e) out[v][e] = to_float(in[v].v[e]);
  }
}

// This lane's part of the dot product of two row slices (one fmaf chain, in element order).
template <typename Ly>
__device__ __forceinline__ float slice_dot(const float (&a)[Ly::kVecsPerLane][Ly::kVec],
                                           const float (&b)[Ly::kVecsPerLane][Ly::kVec]) {
  float acc = 0.f;
#pragma unroll
  for (int v = 0; v < Ly::kVecsPerLane; ++v) {
#pragma unroll
    for (int e = 0; e < Ly::kVec; ++e) acc = fmaf(a[v][e], b[v][e], acc);
  }
  return acc;
}

// This lane's slice of an N-vector of type T (B or C), widened; zero past N.
template <typename Ly, typename T>
__device__ __forceinline__ void load_slice(const T* src, int lane, int64_t N,
                                           float (&out)[Ly::kVecsPerLane][Ly::kVec]) {
  Pack<T, Ly::kVec> packs[Ly::kVecsPerLane];
  load_slice_packs<Ly>(src, lane, N, packs);
  widen_slice<Ly>(packs, out);
}

// Index, inside its chunk, of row k of batch `batch` of this thread's row group.
template <typename Ly> __device__ __forceinline__ int chunk_row(int batch, int k, int group) {
  return batch * Ly::kBatchRows + k * Ly::kRowGroups + group;
}

// Elements of one state row in the tile (and in the state for the vectorised layouts).
template <typename Ly> __device__ __forceinline__ int64_t row_elements(int64_t N) {
  return Ly::kMasked ? N : int64_t(Ly::kCoverN);
}

// Starts loading the chunk's state rows (rows x N, row stride stride_p) into `tile`: the bulk
// copy engine for the vectorised layouts (wait_tile before use), element by element for the
// generic one (visible after the next __syncthreads).
template <typename S, typename Ly>
__device__ __forceinline__ void start_tile_load(S* tile, const S* state, int64_t stride_p,
                                                int rows, int64_t N, uint64_t* barrier) {
  if constexpr (Ly::kMasked) {
    const int count = rows * int(N);
    for (int idx = threadIdx.x; idx < count; idx += kThreads) {
      const int i = idx / int(N), n = idx - i * int(N);
      tile[idx] = load_one(state + i * stride_p + n);
    }
  } else {
    if (threadIdx.x == 0) {
      const unsigned row_bytes = unsigned(Ly::kCoverN * sizeof(S));
      barrier_init(barrier);
      barrier_expect_bytes(barrier, row_bytes * unsigned(rows));
      if (stride_p == Ly::kCoverN) {
        bulk_copy_to_shared(tile, state, row_bytes * unsigned(rows), barrier);
      } else {
        for (int i = 0; i < rows; ++i)
          bulk_copy_to_shared(tile + i * Ly::kCoverN, state + i * stride_p, row_bytes, barrier);
      }
    }
  }
}

template <typename Ly> __device__ __forceinline__ void wait_tile(uint64_t* barrier) {
  if constexpr (!Ly::kMasked) barrier_wait(barrier, 0);
}

// Row i of the tile, this lane's slice, widened (zero for rows past the chunk and past N).
template <typename S, typename Ly>
__device__ __forceinline__ void tile_row(const S* tile, int i, int rows, int lane, int64_t N,
                                         float (&out)[Ly::kVecsPerLane][Ly::kVec]) {
  const S* row = tile + i * row_elements<Ly>(N);
#pragma unroll
  for (int v = 0; v < Ly::kVecsPerLane; ++v) {
    const int n = first_element<Ly>(v, lane);
    if (i < rows && (!Ly::kMasked || n < N)) {
      const Pack<S, Ly::kVec> pk = *reinterpret_cast<const Pack<S, Ly::kVec>*>(row + n);
#pragma unroll
      for (int e = 0; e < Ly::kVec; ++e) out[v][e] = to_float(pk.v[e]);
    } else {
#pragma unroll
      for (int e = 0; e < Ly::kVec; ++e) out[v][e] = 0.f;
    }
  }
}

template <typename S, typename Ly>
__device__ __forceinline__ void store_row(S* state_row, const float (&s)[Ly::kVecsPerLane][Ly::kVec],
                                          int lane, int64_t N) {
#pragma unroll
  for (int v = 0; v < Ly::kVecsPerLane; ++v) {
    const int n = first_element<Ly>(v, lane);
    if (!Ly::kMasked || n < N) {
      Pack<S, Ly::kVec> pk;
#pragma unroll
      for (int e = 0; e < Ly::kVec; ++e) pk.v[e] = from_float<S>(s[v][e]);
      store_pack(state_row + n, pk);
    }
  }
}

// A flushed checkpoint row, rounded as common/rounding.hpp says: an 8-bit row gets its scale from
// its absmax (a max over the row group's lanes) and lane 0 of the group writes it; `stochastic`
// draws element row_element + n's bits from `random` (row_element: the row's first element in the
// slot's (H, P, N) checkpoint). Every lane of the warp calls it (`valid`
// false past the chunk).
template <typename S, typename Ly>
__device__ __forceinline__ void store_checkpoint_row(S* state_row, float* scale, bool valid,
                                                     const float (&s)[Ly::kVecsPerLane][Ly::kVec],
                                                     int lane, int64_t N, bool stochastic,
                                                     FlushRandomBits& random,
                                                     uint32_t row_element) {
  float row_scale = 0.f;
  if constexpr (CheckpointFormat<S>::kScaled) {
    float absmax = 0.f;
#pragma unroll
    for (int v = 0; v < Ly::kVecsPerLane; ++v) {
#pragma unroll
      for (int e = 0; e < Ly::kVec; ++e)
        if (!Ly::kMasked || first_element<Ly>(v, lane) + e < N) absmax = fmaxf(absmax, fabsf(s[v][e]));
    }
#pragma unroll
    for (int offset = Ly::kLanes / 2; offset > 0; offset /= 2)
      absmax = fmaxf(absmax, __shfl_xor_sync(kFullMask, absmax, offset));
    row_scale = checkpoint_scale<S>(absmax);
    if (valid && lane == 0) *scale = row_scale;
  }
  if (!valid) return;
#pragma unroll
  for (int v = 0; v < Ly::kVecsPerLane; ++v) {
    const int n = first_element<Ly>(v, lane);
    if (!Ly::kMasked || n < N) {
      Pack<S, Ly::kVec> pk;
#pragma unroll
      for (int e = 0; e < Ly::kVec; ++e) {
        const uint32_t bits = stochastic ? random(row_element + uint32_t(n + e)) : 0u;
        if constexpr (CheckpointFormat<S>::kScaled)
          pk.v[e] = quantise<S>(s[v][e], row_scale, stochastic, bits);
        else
          pk.v[e] = round_checkpoint<S>(s[v][e], stochastic, bits);
      }
      store_pack(state_row + n, pk);
    }
  }
}

// Slot of batch row `row` on the device, or -1 when the row is skipped (pad or out of range).
__device__ __forceinline__ int64_t device_slot(const Mamba2Params& p, int64_t row) {
  const int64_t slot =
      p.state_batch_indices ? load_one(p.state_batch_indices + row * p.state_batch_indices_stride)
                            : row;
  if (p.state_batch_indices && slot == p.pad_slot_id) return -1;
  return slot >= 0 && slot < p.slots ? slot : -1;
}

__device__ __forceinline__ float head_value(const HeadScalar& s, int64_t h, float absent) {
  return s.data ? load_as<float>(s.data, s.dtype, h * s.stride) : absent;
}

// The (row, head, chunk) a CTA works on: blockIdx.x = head * chunks + chunk, blockIdx.y = row, so
// that the heads of one group run side by side and share their B history in L2. Index arithmetic
// stays in 32 bits (64-bit division is a long subroutine).
struct CtaWork {
  int row, head, group;  // group: the head's group of B and C
  int chunk;
  int first;  // first head_dim row of the chunk
  int rows;   // head_dim rows in the chunk
};

__device__ __forceinline__ CtaWork cta_work(const Mamba2Params& p, int rows_per_cta) {
  const unsigned chunks = unsigned((int(p.head_dim) + rows_per_cta - 1) / rows_per_cta);
  CtaWork w;
  w.chunk = int(blockIdx.x % chunks);
  w.head = int(blockIdx.x / chunks);
  w.group = w.head / int(p.heads_per_group);
  w.row = int(blockIdx.y);
  w.first = w.chunk * rows_per_cta;
  w.rows = min(rows_per_cta, int(p.head_dim) - w.first);
  return w;
}

// Thread 0 waits for the tile while the others wait at the CTA barrier (no spinning warps).
template <typename Ly> __device__ __forceinline__ void wait_tile_all(uint64_t* barrier) {
  if (threadIdx.x == 0) wait_tile<Ly>(barrier);
  __syncthreads();
}

// Baseline: S = exp(A dt) S + dt x B^T, y = S C; reads and writes the whole state.
template <typename S, typename Act, RowLayoutKind kKind>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm) state_update_kernel(const Mamba2Params p,
                                                                int rows_per_cta) {
  using Ly = Layout<S, kKind>;
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* barrier = reinterpret_cast<uint64_t*>(smem);
  const int64_t N = p.state_dim;
  S* tile = reinterpret_cast<S*>(smem + kTileOffset);  // (rows, N)
  float* x_s = reinterpret_cast<float*>(smem + kTileOffset +
                                        tile_bytes(rows_per_cta, row_elements<Ly>(N), sizeof(S)));
  float* z_s = x_s + rows_per_cta;  // (rows)
  const int lane = threadIdx.x % Ly::kLanes, group = threadIdx.x / Ly::kLanes;
  const CtaWork w = cta_work(p, rows_per_cta);
  const int64_t slot = device_slot(p, w.row);
  if (slot < 0) return;
  S* state = static_cast<S*>(p.state) + slot * p.state_stride_slot +
             w.head * p.state_stride_head + w.first * p.state_stride_p;  // (rows, N)
  start_tile_load<S, Ly>(tile, state, p.state_stride_p, w.rows, N, barrier);

  const int64_t g = w.group;
  const float A = head_value(p.A, w.head, 0.f);
  const float dt = effective_dt(load_as<float>(p.dt, p.dt_dtype, w.row * p.dt_stride_batch +
                                                                      w.head * p.dt_stride_head),
                                head_value(p.dt_bias, w.head, 0.f), p.dt_softplus);
  const float D = head_value(p.D, w.head, 0.f);
  float b[Ly::kVecsPerLane][Ly::kVec], c[Ly::kVecsPerLane][Ly::kVec];
  load_slice<Ly>(static_cast<const Act*>(p.B) + w.row * p.B_stride_batch + g * p.B_stride_group,
                 lane, N, b);
  load_slice<Ly>(static_cast<const Act*>(p.C) + w.row * p.C_stride_batch + g * p.C_stride_group,
                 lane, N, c);
  const Act* x = static_cast<const Act*>(p.x) + w.row * p.x_stride_batch +
                 w.head * p.x_stride_head + w.first;  // (rows)
  const bool gated = p.z != nullptr;
  const Act* z = gated ? static_cast<const Act*>(p.z) + w.row * p.z_stride_batch +
                             w.head * p.z_stride_head + w.first
                       : nullptr;  // (rows)
  for (int i = threadIdx.x; i < w.rows; i += kThreads) {
    x_s[i] = to_float(load_one(x + i));
    if (gated) z_s[i] = to_float(load_one(z + i));
  }
  const float decay = expf(A * dt);
  wait_tile_all<Ly>(barrier);

  Act* out = static_cast<Act*>(p.out) + w.row * p.out_stride_batch + w.head * p.out_stride_head +
             w.first;  // (rows)
  const int batches = (w.rows + Ly::kBatchRows - 1) / Ly::kBatchRows;
  for (int batch = 0; batch < batches; ++batch) {
    float y[Ly::kRows];
#pragma unroll
    for (int k = 0; k < Ly::kRows; ++k) {
      const int i = chunk_row<Ly>(batch, k, group);
      float s[Ly::kVecsPerLane][Ly::kVec];
      tile_row<S, Ly>(tile, i, w.rows, lane, N, s);
      const float xdt = i < w.rows ? dt * x_s[i] : 0.f;
      y[k] = 0.f;
#pragma unroll
      for (int v = 0; v < Ly::kVecsPerLane; ++v) {
#pragma unroll
        for (int e = 0; e < Ly::kVec; ++e) {
          s[v][e] = fmaf(xdt, b[v][e], decay * s[v][e]);
          y[k] = fmaf(s[v][e], c[v][e], y[k]);
        }
      }
      if (i < w.rows) store_row<S, Ly>(state + i * p.state_stride_p, s, lane, N);
    }
    row_group_sums<Ly::kLanes>(y);
    store_outputs<Ly>(out, y, batch, group, lane, w.rows, D, x_s, gated ? z_s : nullptr);
  }
}

// One warp: the effective dt of the window's count = cursor + 1 tokens (two per lane), their
// weights weight_j = dt_j exp(A sum_{i>j} dt_i) (into weights[0, 64)) and the checkpoint decay
// exp(A sum_i dt_i) (into *decay). The sums over later tokens are backward suffix sums, never
// differences of prefix sums. raw_dt holds the raw dt of tokens lane and lane + 32.
__device__ __forceinline__ void window_weights(const float (&raw_dt)[2], int cursor, float A,
                                               float bias, bool dt_softplus, float* weights,
                                               float* decay) {
  const int lane = threadIdx.x % 32;
  float dt[2], later[2], total[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int j = lane + 32 * half;
    dt[half] = j <= cursor ? effective_dt(raw_dt[half], bias, dt_softplus) : 0.f;
    total[half] = dt[half];  // becomes sum_{i>=j} dt_i within the half
  }
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float t = __shfl_down_sync(kFullMask, total[half], offset);
      if (lane + offset < 32) total[half] += t;
    }
  }
  const float upper = __shfl_sync(kFullMask, total[1], 0);  // sum of tokens 32..63
  total[0] += upper;
  later[0] = __shfl_down_sync(kFullMask, total[0], 1);
  later[1] = __shfl_down_sync(kFullMask, total[1], 1);
  if (lane == 31) {
    later[0] = upper;
    later[1] = 0.f;
  }
  weights[lane] = dt[0] * expf(A * later[0]);
  weights[lane + 32] = dt[1] * expf(A * later[1]);
  if (lane == 0) *decay = expf(A * total[0]);
}

// The split path's first kernel (a workspace was given): the window work of the non-flush rows,
// done once per (batch row, up to heads_per_cta heads of one group) rather than in every CTA of
// the decode kernel. Per head it writes the checkpoint decay and each head_dim row's history sum
//   hist_i = sum_j weight_j (B_j . C) x_j[i] + D x_i
// to the workspace, and appends this step's x, B and raw dt at the cursor. Pad rows, corrupt
// cursors and flush rows are left to the decode kernel. The cached x and B of the window arrive
// by bulk copies issued as soon as the cursor is known (window_smem_bytes() of shared memory), so
// that the CTA waits on one memory round trip after it.
template <typename Act>
__global__ void __launch_bounds__(kWindowThreads) replay_window_kernel(const ReplayParams p,
                                                                       int heads_per_cta) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ float weights[kMaxWindowHeads][kMaxBufferLen];  // then the history coefficients
  __shared__ float decay[kMaxWindowHeads];
  __shared__ float D_s[kMaxWindowHeads];
  __shared__ float bc[kMaxBufferLen];  // B_j . C
  allow_dependent_launch();  // the decode kernel may start its checkpoint copies now
  constexpr int kWarps = kWindowThreads / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int hpg = int(p.heads_per_group), P = int(p.head_dim), N = int(p.state_dim);
  const int L = int(p.buffer_len);
  const int chunks = (hpg + heads_per_cta - 1) / heads_per_cta;
  const int group = int(blockIdx.x) / chunks;
  const int first_head = group * hpg + (int(blockIdx.x) % chunks) * heads_per_cta;
  const int heads = min(heads_per_cta, (group + 1) * hpg - first_head);
  const int row = int(blockIdx.y);
  const int64_t slot = device_slot(p, row);
  if (slot < 0) return;
  const int cursor = load_one(p.cursors + slot * p.cursors_stride);
  if (cursor < 0 || cursor >= L - 1) return;
  const int count = cursor + 1;

  // The cached history: x of each head (heads, L, P) and B (L, N), positions [0, cursor).
  uint64_t* barrier = reinterpret_cast<uint64_t*>(smem);
  Act* x_s = reinterpret_cast<Act*>(smem + kTileOffset);
  Act* B_s = x_s + heads_per_cta * L * P;
  Act* x_hist = static_cast<Act*>(p.x_cache) + slot * p.xc_stride_slot +
                first_head * p.xc_stride_head;  // (heads, L, P), contiguous positions
  Act* B_hist = static_cast<Act*>(p.B_cache) + slot * p.Bc_stride_slot +
                group * p.Bc_stride_group;  // (L, N), contiguous positions
  if (threadIdx.x == 0 && cursor > 0) {
    const unsigned x_bytes = unsigned(cursor * P * sizeof(Act));
    const unsigned B_bytes = unsigned(cursor * N * sizeof(Act));
    barrier_init(barrier);
    barrier_expect_bytes(barrier, x_bytes * unsigned(heads) + B_bytes);
    for (int k = 0; k < heads; ++k)
      bulk_copy_to_shared(x_s + k * L * P, x_hist + k * p.xc_stride_head, x_bytes, barrier);
    bulk_copy_to_shared(B_s, B_hist, B_bytes, barrier);
  }
  // This step's token and the per-head values, in flight with the copies.
  const Act* B_now = static_cast<const Act*>(p.B) + row * p.B_stride_batch + group * p.B_stride_group;
  constexpr int kPerLane = kMaxStateDim / 32;
  float c[kPerLane];
#pragma unroll
  for (int v = 0; v < kPerLane; ++v) {
    const int n = lane + 32 * v;
    c[v] = n < N ? to_float(load_one(static_cast<const Act*>(p.C) + row * p.C_stride_batch +
                                     group * p.C_stride_group + n))
                 : 0.f;
  }
  float* dt_hist = nullptr;
  float raw_dt[2] = {0.f, 0.f}, raw_now = 0.f, A = 0.f, bias = 0.f, D = 0.f;
  if (warp < heads) {  // warp k: head k's scalars and raw dt, two tokens a lane
    const int h = first_head + warp;
    dt_hist = p.dt_cache + slot * p.dtc_stride_slot + h * p.dtc_stride_head;  // (L)
    raw_now = load_as<float>(p.dt, p.dt_dtype, row * p.dt_stride_batch + h * p.dt_stride_head);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int j = lane + 32 * half;
      raw_dt[half] = j < cursor ? __ldg(dt_hist + j) : raw_now;
    }
    A = head_value(p.A, h, 0.f);
    bias = head_value(p.dt_bias, h, 0.f);
    D = head_value(p.D, h, 0.f);
  }
  Act B_mine[kPerLane];  // B_j of this warp's first token, when it is this step's
#pragma unroll
  for (int v = 0; v < kPerLane; ++v)
    if (warp == cursor % kWarps && lane + 32 * v < N) B_mine[v] = load_one(B_now + lane + 32 * v);
  // This thread's first (head, row) pair's x.
  const Act* x_now = static_cast<const Act*>(p.x) + row * p.x_stride_batch;
  auto x_now_of = [&](int pair) {
    const int k = pair / P;
    return load_one(x_now + (first_head + k) * p.x_stride_head + (pair - k * P));
  };
  const int pairs = heads * P;
  const Act first_now = int(threadIdx.x) < pairs ? x_now_of(threadIdx.x) : Act{};
  // Thread 0 waits for the copies while the others wait at the CTA barrier (after the barrier's
  // initialisation, which they must not race).
  if (threadIdx.x == 0 && cursor > 0) barrier_wait(barrier, 0);
  __syncthreads();

  // Warp k: head k's window weights and decay; this step's raw dt appended.
  if (warp < heads) {
    window_weights(raw_dt, cursor, A, bias, p.dt_softplus, weights[warp], &decay[warp]);
    if (lane == 0) {
      D_s[warp] = D;
      dt_hist[cursor] = raw_now;
    }
  }
  // B_j . C for every token of the window, one warp per token.
  for (int j = warp; j < count; j += kWarps) {
    float sum[1] = {0.f};
#pragma unroll
    for (int v = 0; v < kPerLane; ++v) {
      const int n = lane + 32 * v;
      if (n < N) sum[0] = fmaf(to_float(j < cursor ? B_s[j * N + n] : B_mine[v]), c[v], sum[0]);
    }
    row_group_sums<32>(sum);
    if (lane == 0) bc[j] = sum[0];
  }
  if (first_head == group * hpg && warp == cursor % kWarps) {  // the group's first head appends B
#pragma unroll
    for (int v = 0; v < kPerLane; ++v)
      if (lane + 32 * v < N) B_hist[cursor * p.Bc_stride_pos + lane + 32 * v] = B_mine[v];
  }
  __syncthreads();
  // The history coefficients weight_j (B_j . C), in place of the weights.
  for (int e = threadIdx.x; e < heads * count; e += kWindowThreads)
    weights[e / count][e % count] *= bc[e % count];
  __syncthreads();

  // The history sums, one (head, row) pair per thread at a time.
  float* hist = p.workspace + (int64_t(row) * p.nheads + first_head) * P;  // (heads, P)
  for (int pair = threadIdx.x; pair < pairs; pair += kWindowThreads) {
    const int k = pair / P, i = pair - k * P;
    const Act now = pair == int(threadIdx.x) ? first_now : x_now_of(pair);
    float acc = 0.f;
    for (int j = 0; j < cursor; ++j) acc = fmaf(weights[k][j], to_float(x_s[(k * L + j) * P + i]), acc);
    acc = fmaf(weights[k][cursor], to_float(now), acc);
    hist[pair] = fmaf(D_s[k], to_float(now), acc);
    x_hist[k * p.xc_stride_head + cursor * p.xc_stride_pos + i] = now;
  }
  if (int(threadIdx.x) < heads)
    p.workspace[p.batch * p.nheads * P + int64_t(row) * p.nheads + first_head + threadIdx.x] =
        decay[threadIdx.x];
}

// ReplaySSM standard decode. The window is the cached history (positions 0 .. cursor-1) plus this
// step's token at position `cursor`. Flush rows (cursor == L-1) and the state-and-output route
// form S = decay S0 + sum_j weight_j x_j B_j^T row by row (flush rows store it); the output-only
// route computes y = decay (S0 C) + sum_j weight_j (B_j . C) x_j without forming S. Non-flush rows
// append x, B (first head of the group) and the raw dt at position `cursor`. kStochastic (the
// call's stochastic_rounding) is a separate instantiation: the Philox rounds, compiled into the
// flush rows, cost registers that make the row loop spill under the register cap. kSplit: the
// split path (p.workspace set, output-only route), launched after replay_window_kernel.
template <typename S, typename Act, RowLayoutKind kKind, bool kStochastic, bool kSplit>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm) replay_decode_kernel(const ReplayParams p,
                                                                 int rows_per_cta,
                                                                 bool output_only) {
  using Ly = Layout<S, kKind>;
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* barrier = reinterpret_cast<uint64_t*>(smem);
  const int64_t N = p.state_dim;
  S* tile = reinterpret_cast<S*>(smem + kTileOffset);  // (rows, N)
  float* window = reinterpret_cast<float*>(
      smem + kTileOffset + tile_bytes(rows_per_cta, row_elements<Ly>(N), sizeof(S)));
  float* z_s = window + kWindowZOffset;     // (rows)
  float* scale_s = z_s + rows_per_cta;      // (rows): an 8-bit checkpoint's row scales
  float* x_s = scale_s + rows_per_cta;      // (count, pitch)
  const int pitch = int(window_pitch(rows_per_cta, Ly::kLanes));
  const int lane = threadIdx.x % Ly::kLanes, group = threadIdx.x / Ly::kLanes;
  const CtaWork w = cta_work(p, rows_per_cta);
  const int64_t slot = device_slot(p, w.row);
  // On the split path every exit waits for the window kernel, so that this kernel's completion
  // implies that one's.
  auto finish = [] {
    if constexpr (kSplit) wait_for_prior_kernel();
  };
  if (slot < 0) return finish();
  S* state = static_cast<S*>(p.state) + slot * p.state_stride_slot +
             w.head * p.state_stride_head + w.first * p.state_stride_p;  // (rows, N)
  start_tile_load<S, Ly>(tile, state, p.state_stride_p, w.rows, N, barrier);

  const int64_t g = w.group;
  const int L = int(p.buffer_len);
  const int cursor = load_one(p.cursors + slot * p.cursors_stride);
  // Loads that do not depend on the cursor, in flight together with it.
  const float A = head_value(p.A, w.head, 0.f);
  const float bias = head_value(p.dt_bias, w.head, 0.f);
  const float D = head_value(p.D, w.head, 0.f);
  const float raw_dt_now =
      load_as<float>(p.dt, p.dt_dtype, w.row * p.dt_stride_batch + w.head * p.dt_stride_head);
  const Act* B_now = static_cast<const Act*>(p.B) + w.row * p.B_stride_batch +
                     g * p.B_stride_group;  // (N)
  float c[Ly::kVecsPerLane][Ly::kVec];
  load_slice<Ly>(static_cast<const Act*>(p.C) + w.row * p.C_stride_batch + g * p.C_stride_group,
                 lane, N, c);
  const Act* x_now = static_cast<const Act*>(p.x) + w.row * p.x_stride_batch +
                     w.head * p.x_stride_head + w.first;  // (rows)
  const bool gated = p.z != nullptr;
  const float z_mine =  // z of chunk row threadIdx.x (rows_per_cta <= kThreads)
      gated && int(threadIdx.x) < w.rows
          ? to_float(load_one(static_cast<const Act*>(p.z) + w.row * p.z_stride_batch +
                              w.head * p.z_stride_head + w.first + threadIdx.x))
          : 0.f;
  float* scale = CheckpointFormat<S>::kScaled
                     ? p.state_scale + slot * p.scale_stride_slot + w.head * p.scale_stride_head + w.first
                     : nullptr;  // (rows)
  const float scale_mine =  // the row scale of chunk row threadIdx.x
      CheckpointFormat<S>::kScaled && int(threadIdx.x) < w.rows ? scale[threadIdx.x] : 1.f;
  // The first head of a group appends B: elements threadIdx.x and threadIdx.x + kThreads.
  const bool appends_B = w.chunk == 0 && w.head == w.group * int(p.heads_per_group);
  Act B_mine[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int n = threadIdx.x + h * kThreads;
    if (appends_B && n < N) B_mine[h] = load_one(B_now + n);
  }
  if (cursor < 0 || cursor >= L) {  // a corrupt cursor: skip the row, touch nothing
    wait_tile<Ly>(barrier);         // (after the copy into this CTA's shared memory has landed)
    return finish();
  }

  const int count = cursor + 1;
  const bool flush = cursor == L - 1;
  if (kSplit && !flush) {
    // Split path: the window kernel has appended the token and left the decay and each row's
    // history sum (D x included) in the workspace; y = decay (S0 C) + hist.
    wait_for_prior_kernel();
    const int64_t head_index = int64_t(w.row) * p.nheads + w.head;
    const float decay = p.workspace[p.batch * p.nheads * p.head_dim + head_index];
    float* hist_s = x_s;  // (rows)
    if (int(threadIdx.x) < w.rows) {
      hist_s[threadIdx.x] = p.workspace[head_index * p.head_dim + w.first + threadIdx.x];
      if (gated) z_s[threadIdx.x] = z_mine;
      if (CheckpointFormat<S>::kScaled) scale_s[threadIdx.x] = scale_mine;
    }
    wait_tile_all<Ly>(barrier);
    Act* out = static_cast<Act*>(p.out) + w.row * p.out_stride_batch +
               w.head * p.out_stride_head + w.first;  // (rows)
    const int batches = (w.rows + Ly::kBatchRows - 1) / Ly::kBatchRows;
    for (int batch = 0; batch < batches; ++batch) {
      float y[Ly::kRows];
#pragma unroll
      for (int k = 0; k < Ly::kRows; ++k) {
        const int i = chunk_row<Ly>(batch, k, group);
        float s[Ly::kVecsPerLane][Ly::kVec];
        tile_row<S, Ly>(tile, i, w.rows, lane, N, s);
        y[k] = decay * (CheckpointFormat<S>::kScaled && i < w.rows ? scale_s[i] : 1.f) *
               slice_dot<Ly>(s, c);
      }
      row_group_sums<Ly::kLanes>(y);
      store_outputs<Ly>(out, y, batch, group, lane, w.rows, 1.f, hist_s, gated ? z_s : nullptr);
    }
    return;
  }
  const bool form_state = flush || !output_only;
  Act* x_hist = static_cast<Act*>(p.x_cache) + slot * p.xc_stride_slot +
                w.head * p.xc_stride_head + w.first;  // (L, rows), position stride xc_stride_pos
  Act* B_hist = static_cast<Act*>(p.B_cache) + slot * p.Bc_stride_slot +
                g * p.Bc_stride_group;  // (L, N), position stride Bc_stride_pos
  float* dt_hist = p.dt_cache + slot * p.dtc_stride_slot + w.head * p.dtc_stride_head;  // (L)
  auto B_of = [&](int j) { return j < cursor ? B_hist + j * p.Bc_stride_pos : B_now; };
  // Thread t stages the window's x of chunk row i_x for tokens j_x, j_x + x_step, ...
  const int x_step = kThreads / rows_per_cta;
  const int i_x = threadIdx.x % rows_per_cta, j_x = threadIdx.x / rows_per_cta;
  const bool stages_x = i_x < w.rows && j_x < x_step;
  auto x_of = [&](int j) {
    return load_one(j < cursor ? x_hist + j * p.xc_stride_pos + i_x : x_now + i_x);
  };
  auto stage_x = [&](int j, Act v) {
    x_s[j * pitch + i_x] = to_float(v);
    if (j == cursor && !flush) x_hist[cursor * p.xc_stride_pos + i_x] = v;
  };

  // The window's loads (raw dt, B_j of the first tokens of each row group, the first x values of
  // each thread) are all issued before any is used: one memory round trip for windows up to
  // kEarlyRounds * row_groups tokens and kEarlyX * x_step tokens of x (L = 16 with whole heads of
  // 64); the loops after them finish longer windows.
  constexpr int kEarlyRounds = Ly::kRowGroups >= 16 ? 1 : 16 / Ly::kRowGroups, kEarlyX = 8;
  float raw_dt[2] = {raw_dt_now, raw_dt_now};
  if (threadIdx.x < 32) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = threadIdx.x + 32 * h;
      if (j < cursor) raw_dt[h] = __ldg(dt_hist + j);
    }
  }
  Pack<Act, Ly::kVec> b_early[kEarlyRounds][Ly::kVecsPerLane];
  if (!form_state) {
#pragma unroll
    for (int r = 0; r < kEarlyRounds; ++r) {
      const int j = r * Ly::kRowGroups + group;
      if (j < count) load_slice_packs<Ly>(B_of(j), lane, N, b_early[r]);
    }
  }
  Act x_early[kEarlyX];
#pragma unroll
  for (int u = 0; u < kEarlyX; ++u) {
    const int j = j_x + u * x_step;
    if (stages_x && j < count) x_early[u] = x_of(j);
  }

  if (threadIdx.x < 32) {
    window_weights(raw_dt, cursor, A, bias, p.dt_softplus, window + kWeightsOffset,
                   window + kDecayOffset);
    if (threadIdx.x == 0 && !flush && w.chunk == 0) dt_hist[cursor] = raw_dt_now;
  }
  // B_j . C for every token of the window, one token per row group and round.
  if (!form_state) {
    float bc[kEarlyRounds];
#pragma unroll
    for (int r = 0; r < kEarlyRounds; ++r) {
      float b[Ly::kVecsPerLane][Ly::kVec];
      widen_slice<Ly>(b_early[r], b);
      bc[r] = slice_dot<Ly>(b, c);
    }
    row_group_sums<Ly::kLanes>(bc);
#pragma unroll
    for (int r = 0; r < kEarlyRounds; ++r) {
      const int j = r * Ly::kRowGroups + group;
      if (lane == 0 && j < count) window[kBCOffset + j] = bc[r];
    }
    for (int j0 = kEarlyRounds * Ly::kRowGroups; j0 < count; j0 += Ly::kRowGroups) {
      const int j = j0 + group;
      float later[1] = {0.f};
      if (j < count) {
        float b[Ly::kVecsPerLane][Ly::kVec];
        load_slice<Ly>(B_of(j), lane, N, b);
        later[0] = slice_dot<Ly>(b, c);
      }
      row_group_sums<Ly::kLanes>(later);
      if (lane == 0 && j < count) window[kBCOffset + j] = later[0];
    }
  }
  // The window's x for this chunk (widened), appending this step's x to the cache.
#pragma unroll
  for (int u = 0; u < kEarlyX; ++u) {
    const int j = j_x + u * x_step;
    if (stages_x && j < count) stage_x(j, x_early[u]);
  }
  if (stages_x) {
#pragma unroll 4
    for (int j = j_x + kEarlyX * x_step; j < count; j += x_step) stage_x(j, x_of(j));
  }
  if (gated && int(threadIdx.x) < w.rows) z_s[threadIdx.x] = z_mine;
  if (CheckpointFormat<S>::kScaled && int(threadIdx.x) < w.rows) scale_s[threadIdx.x] = scale_mine;
  if (appends_B && !flush) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = threadIdx.x + h * kThreads;
      if (n < N) B_hist[cursor * p.Bc_stride_pos + n] = B_mine[h];
    }
  }
  wait_tile_all<Ly>(barrier);

  const float decay = window[kDecayOffset];
  // Output-only: the history coefficient weight_j (B_j . C) of each token, in place of B_j . C.
  if (!form_state) {
    if (int(threadIdx.x) < count) window[kBCOffset + threadIdx.x] *= window[kWeightsOffset + threadIdx.x];
    __syncthreads();
  }
  const float* coef = window + kBCOffset;  // (count), output-only
  // Stochastic rounding of a flush: this slot's bits for its current flush count.
  FlushRandomBits random(0, 0, 0, 0);
  if (kStochastic && flush)
    random = FlushRandomBits(uint32_t(load_one(p.rounding_seed)),
                             uint32_t(load_one(p.rounding_seed + p.rounding_seed_stride)), uint32_t(slot),
                             uint32_t(load_one(p.flush_counts + slot * p.flush_counts_stride)));
  auto row_scale = [&](int i) { return CheckpointFormat<S>::kScaled && i < w.rows ? scale_s[i] : 1.f; };
  Act* out = static_cast<Act*>(p.out) + w.row * p.out_stride_batch + w.head * p.out_stride_head +
             w.first;  // (rows)
  const int batches = (w.rows + Ly::kBatchRows - 1) / Ly::kBatchRows;
  for (int batch = 0; batch < batches; ++batch) {
    float y[Ly::kRows];
#pragma unroll
    for (int k = 0; k < Ly::kRows; ++k) {
      const int i = chunk_row<Ly>(batch, k, group);
      float s[Ly::kVecsPerLane][Ly::kVec];
      tile_row<S, Ly>(tile, i, w.rows, lane, N, s);
      if (form_state) {  // one row at a time: its state stays in registers across the tokens
#pragma unroll
        for (int v = 0; v < Ly::kVecsPerLane; ++v) {
#pragma unroll
          for (int e = 0; e < Ly::kVec; ++e) s[v][e] *= decay * row_scale(i);
        }
        constexpr int kTokensInFlight = 2;
        for (int j0 = 0; j0 < count; j0 += kTokensInFlight) {
          Pack<Act, Ly::kVec> bj[kTokensInFlight][Ly::kVecsPerLane];
#pragma unroll
          for (int t = 0; t < kTokensInFlight; ++t) {
            if (j0 + t < count) load_slice_packs<Ly>(B_of(j0 + t), lane, N, bj[t]);
          }
#pragma unroll
          for (int t = 0; t < kTokensInFlight; ++t) {
            const int j = j0 + t;
            if (j >= count) break;
            float b[Ly::kVecsPerLane][Ly::kVec];
            widen_slice<Ly>(bj[t], b);
            const float a = i < w.rows ? window[kWeightsOffset + j] * x_s[j * pitch + i] : 0.f;
#pragma unroll
            for (int v = 0; v < Ly::kVecsPerLane; ++v) {
#pragma unroll
              for (int e = 0; e < Ly::kVec; ++e) s[v][e] = fmaf(a, b[v][e], s[v][e]);
            }
          }
        }
        if (flush)
          store_checkpoint_row<S, Ly>(state + i * p.state_stride_p, scale ? scale + i : nullptr,
                                      i < w.rows, s, lane, N, kStochastic, random,
                                      uint32_t((w.head * p.head_dim + w.first + i) * N));
        y[k] = slice_dot<Ly>(s, c);
      } else {  // output-only: lane l adds the history terms of tokens l, l + kLanes, ...
        y[k] = decay * row_scale(i) * slice_dot<Ly>(s, c);
        if (i < w.rows) {
          for (int j = lane; j < count; j += Ly::kLanes) y[k] = fmaf(coef[j], x_s[j * pitch + i], y[k]);
        }
      }
    }
    row_group_sums<Ly::kLanes>(y);
    store_outputs<Ly>(out, y, batch, group, lane, w.rows, D, x_s + cursor * pitch,
                      gated ? z_s : nullptr);
  }
  finish();
}

}  // namespace replayssm::cuda
