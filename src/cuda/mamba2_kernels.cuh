// Mamba-2 decode kernels: the baseline selective_state_update and ReplaySSM standard decode,
// templated on the state type S, the activation type Act and the row layout (row_layout.hpp).
//
// One CTA handles one (batch row, head, chunk of head_dim rows). As soon as the row's slot is known
// its first thread starts the bulk copy of the chunk's state rows into shared memory (one
// instruction, completing on an mbarrier); the replay then issues every load of its window at once,
// before the cursor that selects the valid tokens has arrived, so that a CTA waits on about as
// many memory round trips as the baseline. All arithmetic is fp32 FMA on values widened from their
// storage type; nothing is rounded to 16 bits before a final store.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "api/params.hpp"
#include "common/mamba2_math.hpp"
#include "cuda/row_layout.hpp"

namespace replayssm::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

// Registers are capped so that enough CTAs fit an SM to keep the state's bytes in flight that the
// bandwidth needs: six whole fp32 heads (32 KiB tiles) fill the shared memory; 16-bit tiles are
// half as large, so the baseline fits eight and the replay (more registers: its window) six.
template <typename S> constexpr int baseline_ctas_per_sm() { return sizeof(S) == 4 ? 6 : 8; }
template <typename S> constexpr int replay_ctas_per_sm() { return 6; }

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
    for (int i = 0; i < kBytes / 16; ++i) {
      reinterpret_cast<uint4*>(&r)[i] = __ldg(reinterpret_cast<const uint4*>(p) + i);
    }
  } else if constexpr (kBytes == 8) {
    *reinterpret_cast<uint2*>(&r) = __ldg(reinterpret_cast<const uint2*>(p));
  } else if constexpr (kBytes == 4) {
    *reinterpret_cast<unsigned*>(&r) = __ldg(reinterpret_cast<const unsigned*>(p));
  } else {
    static_assert(kBytes == 2, "packs are 2, 4, 8 or a multiple of 16 bytes");
    *reinterpret_cast<unsigned short*>(&r) = __ldg(reinterpret_cast<const unsigned short*>(p));
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
  } else {
    *reinterpret_cast<unsigned short*>(p) = *reinterpret_cast<const unsigned short*>(&v);
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

__device__ __forceinline__ void barrier_wait(uint64_t* barrier, unsigned parity) {
  unsigned done = 0;
  do {
    asm volatile(
        "{\n .reg .pred complete;\n"
        " mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
        " selp.u32 %0, 1, 0, complete;\n}"
        : "=r"(done)
        : "r"(shared_address(barrier)), "r"(parity)
        : "memory");
  } while (!done);
}

// The compile-time view of a RowLayout.
template <typename S, RowLayoutKind kKind> struct Layout {
  static constexpr RowLayout kSpec = make_row_layout(int(sizeof(S)), kKind);
  static constexpr bool kMasked = kKind == RowLayoutKind::kGeneric;  // check n < N per element
  static constexpr int kVec = kSpec.vec;
  static constexpr int kLanes = kSpec.lanes;
  static constexpr int kVecsPerLane = kSpec.vecs_per_lane;
  static constexpr int kRowsPerLane = kSpec.rows_per_lane;
  static constexpr int kRowsPerAccess = kSpec.rows_per_access();
  // After the transposing reduction each row's sum sits in this many lanes of its group.
  static constexpr int kLanesPerRowSum = kLanes / kRowsPerLane;
  // Window tokens whose B_j . C a lane computes at once.
  static constexpr int kTokensPerLane = kLanes < 4 ? kLanes : 4;
};

// Where a lane sits: its warp, its row group within a warp access (`sub`) and its place in the
// group (`part`, which slice of a row it holds).
struct LanePlace {
  int warp, sub, part;
};

template <typename Ly> __device__ __forceinline__ LanePlace lane_place() {
  const int lane = int(threadIdx.x) % 32;
  return LanePlace{int(threadIdx.x) / 32, lane / Ly::kLanes, lane % Ly::kLanes};
}

// First element of a row that this lane reads in access v.
template <typename Ly> __device__ __forceinline__ int element(int v, int part) {
  return (v * Ly::kLanes + part) * Ly::kVec;
}

// Chunk row of the lane's row k; the warp works on rows [warp * rows_per_warp, +rows_per_warp).
template <typename Ly>
__device__ __forceinline__ int lane_row(const LanePlace& at, int k, int rows_per_warp) {
  return at.warp * rows_per_warp + k * Ly::kRowsPerAccess + at.sub;
}

template <typename Ly>
__device__ __forceinline__ bool has_row(const LanePlace& at, int k, int rows_per_warp, int rows) {
  const int in_warp = k * Ly::kRowsPerAccess + at.sub;
  return in_warp < rows_per_warp && at.warp * rows_per_warp + in_warp < rows;
}

// Sums value k of every lane over the kLanes lanes of a group, for kCount values at once: each
// step trades half of the values with the partner lane, so kCount sums take kCount - 1 + log2
// shuffles instead of kCount log2. Afterwards value 0 of a lane is the partial sum of value
// folded_index(part) over kLanes / kCount lanes; sum_row_lanes finishes it.
template <int kOffset, int kHalf, int kCount>
__device__ __forceinline__ void fold_values(float (&v)[kCount], int part) {
  if constexpr (kHalf >= 1) {
    const bool upper = (part & kOffset) != 0;
#pragma unroll
    for (int i = 0; i < kHalf; ++i) {
      const float send = upper ? v[i] : v[i + kHalf];
      const float keep = upper ? v[i + kHalf] : v[i];
      v[i] = keep + __shfl_xor_sync(kFullMask, send, kOffset);
    }
    fold_values<kOffset / 2, kHalf / 2>(v, part);
  }
}

template <int kLanes, int kCount> __device__ __forceinline__ int folded_index(int part) {
  int index = 0;
#pragma unroll
  for (int offset = kLanes / 2, half = kCount / 2; half >= 1; offset /= 2, half /= 2)
    if (part & offset) index += half;
  return index;
}

// Sum over the kLanesPerSum lanes that share a folded value (all 32 lanes call it).
template <int kLanesPerSum> __device__ __forceinline__ float sum_row_lanes(float v) {
#pragma unroll
  for (int offset = kLanesPerSum / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// This lane's slice of an N-vector of type T (B or C) in the state's layout, as stored; zero
// past N.
template <typename Ly, typename T>
__device__ __forceinline__ void load_slice_packs(const T* src, int part, int64_t N,
                                                 Pack<T, Ly::kVec> (&out)[Ly::kVecsPerLane]) {
#pragma unroll
  for (int v = 0; v < Ly::kVecsPerLane; ++v) {
    const int n = element<Ly>(v, part);
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

template <typename Ly, typename T>
__device__ __forceinline__ void load_slice(const T* src, int part, int64_t N,
                                           float (&out)[Ly::kVecsPerLane][Ly::kVec]) {
  Pack<T, Ly::kVec> packs[Ly::kVecsPerLane];
  load_slice_packs<Ly>(src, part, N, packs);
  widen_slice<Ly>(packs, out);
}

template <typename Ly>
__device__ __forceinline__ float dot_slice(const float (&a)[Ly::kVecsPerLane][Ly::kVec],
                                           const float (&b)[Ly::kVecsPerLane][Ly::kVec]) {
  float sum = 0.f;
#pragma unroll
  for (int v = 0; v < Ly::kVecsPerLane; ++v) {
#pragma unroll
    for (int e = 0; e < Ly::kVec; ++e) sum = fmaf(a[v][e], b[v][e], sum);
  }
  return sum;
}

// Starts loading the chunk's state rows (rows x N, row stride stride_p) into `tile`: the bulk
// copy engine for the vectorised layouts (complete after wait_tile), element by element for the
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
  } else if (threadIdx.x == 0) {
    const unsigned row_bytes = unsigned(N * sizeof(S));
    barrier_init(barrier);
    barrier_expect_bytes(barrier, row_bytes * unsigned(rows));
    if (stride_p == N) {
      bulk_copy_to_shared(tile, state, row_bytes * unsigned(rows), barrier);
    } else {
      for (int i = 0; i < rows; ++i)
        bulk_copy_to_shared(tile + i * N, state + i * stride_p, row_bytes, barrier);
    }
  }
}

// Thread 0 waits for the tile while the others wait at the CTA barrier (no spinning warps).
template <typename Ly> __device__ __forceinline__ void wait_tile(uint64_t* barrier) {
  if constexpr (!Ly::kMasked) {
    if (threadIdx.x == 0) barrier_wait(barrier, 0);
  }
  __syncthreads();
}

// This lane's slice of chunk row i of the tile, widened (zero where `valid` is false and past N).
template <typename S, typename Ly>
__device__ __forceinline__ void tile_row(const S* tile, int i, bool valid, int part, int64_t N,
                                         float (&out)[Ly::kVecsPerLane][Ly::kVec]) {
  const S* row = tile + i * N;
#pragma unroll
  for (int v = 0; v < Ly::kVecsPerLane; ++v) {
    const int n = element<Ly>(v, part);
    if (valid && (!Ly::kMasked || n < N)) {
      const Pack<S, Ly::kVec> pk = *reinterpret_cast<const Pack<S, Ly::kVec>*>(row + n);
#pragma unroll
      for (int e = 0; e < Ly::kVec; ++e) out[v][e] = to_float(pk.v[e]);
    } else {
#pragma unroll
      for (int e = 0; e < Ly::kVec; ++e) out[v][e] = 0.f;
    }
  }
}

// The lane's slice of row i of the fp32 work tile (zero where `valid` is false and past N).
template <typename Ly>
__device__ __forceinline__ void work_row(const float* work, int i, bool valid, int part, int64_t N,
                                         float (&out)[Ly::kVecsPerLane][Ly::kVec]) {
#pragma unroll
  for (int v = 0; v < Ly::kVecsPerLane; ++v) {
    const int n = element<Ly>(v, part);
    const bool in = valid && (!Ly::kMasked || n < N);
#pragma unroll
    for (int e = 0; e < Ly::kVec; ++e) out[v][e] = in ? work[i * N + n + e] : 0.f;
  }
}

template <typename Ly>
__device__ __forceinline__ void store_work_row(float* work, int i, int part, int64_t N,
                                               const float (&s)[Ly::kVecsPerLane][Ly::kVec]) {
#pragma unroll
  for (int v = 0; v < Ly::kVecsPerLane; ++v) {
    const int n = element<Ly>(v, part);
    if (!Ly::kMasked || n < N) {
#pragma unroll
      for (int e = 0; e < Ly::kVec; ++e) work[i * N + n + e] = s[v][e];
    }
  }
}

template <typename S, typename Ly>
__device__ __forceinline__ void store_row(S* row, const float (&s)[Ly::kVecsPerLane][Ly::kVec],
                                          int part, int64_t N) {
#pragma unroll
  for (int v = 0; v < Ly::kVecsPerLane; ++v) {
    const int n = element<Ly>(v, part);
    if (!Ly::kMasked || n < N) {
      Pack<S, Ly::kVec> pk;
#pragma unroll
      for (int e = 0; e < Ly::kVec; ++e) pk.v[e] = from_float<S>(s[v][e]);
      store_pack(row + n, pk);
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
  int first;          // first head_dim row of the chunk
  int rows;           // head_dim rows in the chunk
  int rows_per_warp;  // chunk rows each warp holds
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
  w.rows_per_warp = rows_per_cta / kWarps;
  return w;
}

// The chunk row whose output this lane finishes (after fold_values), and whether it writes it:
// the first of the lanes that share the row's sum.
template <typename Ly> struct OutputLane {
  int row;
  int share;  // place among the lanes sharing the row's sum
  bool valid;
};

template <typename Ly>
__device__ __forceinline__ OutputLane<Ly> output_lane(const LanePlace& at, const CtaWork& w) {
  const int k = folded_index<Ly::kLanes, Ly::kRowsPerLane>(at.part);
  return OutputLane<Ly>{lane_row<Ly>(at, k, w.rows_per_warp),
                        at.part % Ly::kLanesPerRowSum,
                        has_row<Ly>(at, k, w.rows_per_warp, w.rows)};
}

// Rows that form their state start from decay x the tile, as fp32 in the work tile: in place for
// an fp32 state; a 16-bit tile is widened into the work tile it starts, every lane reading its
// elements before any lane writes.
template <typename S, typename Ly>
__device__ __forceinline__ void widen_tile(const S* tile, float* work, float decay,
                                           const LanePlace& at, const CtaWork& w, int64_t N) {
  auto store_scaled = [&](int k, float (&s)[Ly::kVecsPerLane][Ly::kVec]) {
#pragma unroll
    for (int v = 0; v < Ly::kVecsPerLane; ++v) {
#pragma unroll
      for (int e = 0; e < Ly::kVec; ++e) s[v][e] *= decay;
    }
    if (has_row<Ly>(at, k, w.rows_per_warp, w.rows))
      store_work_row<Ly>(work, lane_row<Ly>(at, k, w.rows_per_warp), at.part, N, s);
  };
  if constexpr (sizeof(S) == sizeof(float)) {
#pragma unroll
    for (int k = 0; k < Ly::kRowsPerLane; ++k) {
      float s[Ly::kVecsPerLane][Ly::kVec];
      work_row<Ly>(work, lane_row<Ly>(at, k, w.rows_per_warp),
                   has_row<Ly>(at, k, w.rows_per_warp, w.rows), at.part, N, s);
      store_scaled(k, s);
    }
  } else {
    Pack<S, Ly::kVec> rows[Ly::kRowsPerLane][Ly::kVecsPerLane];
#pragma unroll
    for (int k = 0; k < Ly::kRowsPerLane; ++k) {
      const S* row = tile + lane_row<Ly>(at, k, w.rows_per_warp) * N;
#pragma unroll
      for (int v = 0; v < Ly::kVecsPerLane; ++v) {
        const int n = element<Ly>(v, at.part);
        rows[k][v] = has_row<Ly>(at, k, w.rows_per_warp, w.rows) && (!Ly::kMasked || n < N)
                         ? *reinterpret_cast<const Pack<S, Ly::kVec>*>(row + n)
                         : Pack<S, Ly::kVec>{};
      }
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < Ly::kRowsPerLane; ++k) {
      float s[Ly::kVecsPerLane][Ly::kVec];
      widen_slice<Ly>(rows[k], s);
      store_scaled(k, s);
    }
  }
}

// out_i = (y_i + D x_i) * silu(z_i), rounded to Act, by one lane per row.
template <typename Act>
__device__ __forceinline__ void store_output(Act* out, int i, float y, float D, float x, bool gated,
                                             float z) {
  float v = fmaf(D, x, y);
  if (gated) v *= silu(z);
  out[i] = from_float<Act>(v);
}

// Baseline: S = exp(A dt) S + dt x B^T, y = S C; reads and writes the whole state.
template <typename S, typename Act, RowLayoutKind kKind>
__global__ void __launch_bounds__(kThreads, baseline_ctas_per_sm<S>())
    state_update_kernel(const Mamba2Params p, int rows_per_cta) {
  using Ly = Layout<S, kKind>;
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* barrier = reinterpret_cast<uint64_t*>(smem);
  S* tile = reinterpret_cast<S*>(smem + kTileOffset);  // (rows, N)
  const int64_t N = p.state_dim;
  const LanePlace at = lane_place<Ly>();
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
                 at.part, N, b);
  load_slice<Ly>(static_cast<const Act*>(p.C) + w.row * p.C_stride_batch + g * p.C_stride_group,
                 at.part, N, c);
  const Act* x = static_cast<const Act*>(p.x) + w.row * p.x_stride_batch +
                 w.head * p.x_stride_head + w.first;  // (rows)
  Act x_rows[Ly::kRowsPerLane];
#pragma unroll
  for (int k = 0; k < Ly::kRowsPerLane; ++k)
    x_rows[k] = has_row<Ly>(at, k, w.rows_per_warp, w.rows)
                    ? load_one(x + lane_row<Ly>(at, k, w.rows_per_warp))
                    : Act{};
  const OutputLane<Ly> o = output_lane<Ly>(at, w);
  const bool gated = p.z != nullptr;
  const float z_out = gated && o.valid ? to_float(load_one(static_cast<const Act*>(p.z) +
                                                           w.row * p.z_stride_batch +
                                                           w.head * p.z_stride_head + w.first + o.row))
                                       : 0.f;
  const float decay = expf(A * dt);
  wait_tile<Ly>(barrier);

  float y[Ly::kRowsPerLane];
#pragma unroll
  for (int k = 0; k < Ly::kRowsPerLane; ++k) {
    const int i = lane_row<Ly>(at, k, w.rows_per_warp);
    const bool valid = has_row<Ly>(at, k, w.rows_per_warp, w.rows);
    float s[Ly::kVecsPerLane][Ly::kVec];
    tile_row<S, Ly>(tile, i, valid, at.part, N, s);
    const float xdt = dt * to_float(x_rows[k]);
#pragma unroll
    for (int v = 0; v < Ly::kVecsPerLane; ++v) {
#pragma unroll
      for (int e = 0; e < Ly::kVec; ++e) s[v][e] = fmaf(xdt, b[v][e], decay * s[v][e]);
    }
    y[k] = dot_slice<Ly>(s, c);
    if (valid) store_row<S, Ly>(state + i * p.state_stride_p, s, at.part, N);
  }
  fold_values<Ly::kLanes / 2, Ly::kRowsPerLane / 2>(y, at.part);
  const float y_out = sum_row_lanes<Ly::kLanesPerRowSum>(y[0]);
  if (o.valid && o.share == 0) {
    Act* out = static_cast<Act*>(p.out) + w.row * p.out_stride_batch +
               w.head * p.out_stride_head + w.first;  // (rows)
    store_output(out, o.row, y_out, D, to_float(load_one(x + o.row)), gated, z_out);
  }
}

// Warp 0: the effective dt of the window's count = cursor + 1 tokens (two per lane), their weights
// weight_j = dt_j exp(A sum_{i>j} dt_i) and the checkpoint decay exp(A sum_i dt_i). The sums over
// later tokens are backward suffix sums, never differences of prefix sums.
// raw_dt holds the raw dt of tokens lane and lane + 32.
__device__ __forceinline__ void window_weights(const float (&raw_dt)[2], int cursor, float A,
                                               float bias, bool dt_softplus, float* window) {
  const int lane = threadIdx.x;
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
  window[kWeightsOffset + lane] = dt[0] * expf(A * later[0]);
  window[kWeightsOffset + lane + 32] = dt[1] * expf(A * later[1]);
  if (lane == 0) window[kDecayOffset] = expf(A * total[0]);
}

// Rows that form their state: tokens j0 .. j0 + kStage - 1 (< count) of the window into
// the stage, x widened (token-major, rows_per_cta apart) and B as stored (N apart).
template <typename Ly, int kStage, typename Act, typename XOf, typename BOf>
__device__ __forceinline__ void stage_window(int j0, int count, int rows, int rows_per_cta,
                                             int64_t N, XOf x_of, BOf B_of, float* staged_x,
                                             Act* staged_B) {
  const int tokens = min(kStage, count - j0);
  for (int idx = threadIdx.x; idx < tokens * rows; idx += kThreads) {
    const int t = idx / rows, i = idx - t * rows;
    staged_x[t * rows_per_cta + i] = x_of(j0 + t, i);
  }
  const int packs = int(N) / Ly::kVec;  // N is a multiple of kVec (1 for the generic layout)
  for (int idx = threadIdx.x; idx < tokens * packs; idx += kThreads) {
    const int t = idx / packs, n = (idx - t * packs) * Ly::kVec;
    *reinterpret_cast<Pack<Act, Ly::kVec>*>(staged_B + t * N + n) =
        load_pack<Act, Ly::kVec>(B_of(j0 + t) + n);
  }
}

// This lane's slice of a staged B row, widened; zero past N.
template <typename Ly, typename Act>
__device__ __forceinline__ void staged_slice(const Act* row, int part, int64_t N,
                                             float (&out)[Ly::kVecsPerLane][Ly::kVec]) {
#pragma unroll
  for (int v = 0; v < Ly::kVecsPerLane; ++v) {
    const int n = element<Ly>(v, part);
    Pack<Act, Ly::kVec> pk{};
    if (!Ly::kMasked || n < N) pk = *reinterpret_cast<const Pack<Act, Ly::kVec>*>(row + n);
#pragma unroll
    for (int e = 0; e < Ly::kVec; ++e) out[v][e] = to_float(pk.v[e]);
  }
}

// B_j . C of the window's tokens j < count into window[kBCOffset + j]. The tokens are spread over
// the warps like state rows, kTokensPerLane a lane; a pass covers kTokensPerPass of them.
template <typename Ly> constexpr int kTokensPerPass = kWarps * Ly::kTokensPerLane * Ly::kRowsPerAccess;

template <typename Ly>
__device__ __forceinline__ int pass_token(const LanePlace& at, int base, int k) {
  return base + (at.warp * Ly::kTokensPerLane + k) * Ly::kRowsPerAccess + at.sub;
}

template <typename Ly, typename Act>
__device__ __forceinline__ void pass_bc(const LanePlace& at, int base, int count,
                                        const Pack<Act, Ly::kVec> (&b_packs)[Ly::kTokensPerLane][Ly::kVecsPerLane],
                                        const float (&c)[Ly::kVecsPerLane][Ly::kVec],
                                        float* window) {
  float bc[Ly::kTokensPerLane];
#pragma unroll
  for (int k = 0; k < Ly::kTokensPerLane; ++k) {
    float b[Ly::kVecsPerLane][Ly::kVec];
    widen_slice<Ly>(b_packs[k], b);
    bc[k] = pass_token<Ly>(at, base, k) < count ? dot_slice<Ly>(b, c) : 0.f;
  }
  fold_values<Ly::kLanes / 2, Ly::kTokensPerLane / 2>(bc, at.part);
  constexpr int kLanesPerSum = Ly::kLanes / Ly::kTokensPerLane;
  const float sum = sum_row_lanes<kLanesPerSum>(bc[0]);
  const int j = pass_token<Ly>(at, base, folded_index<Ly::kLanes, Ly::kTokensPerLane>(at.part));
  if (at.part % kLanesPerSum == 0 && j < count) window[kBCOffset + j] = sum;
}

// ReplaySSM standard decode. The window is the cached history (positions 0 .. cursor-1) plus this
// step's token at position `cursor`. Flush rows (cursor == L-1) and the state-and-output route
// form S = decay S0 + sum_j weight_j x_j B_j^T row by row (flush rows store it); the output-only
// route computes y = decay (S0 C) + sum_j weight_j (B_j . C) x_j without forming S. Non-flush rows
// append x, B (first head of the group) and the raw dt at position `cursor`.
template <typename S, typename Act, RowLayoutKind kKind>
__global__ void __launch_bounds__(kThreads, replay_ctas_per_sm<S>())
    replay_decode_kernel(const ReplayParams p, int rows_per_cta, bool output_only) {
  using Ly = Layout<S, kKind>;
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* barrier = reinterpret_cast<uint64_t*>(smem);
  const int64_t N = p.state_dim;
  S* tile = reinterpret_cast<S*>(smem + kTileOffset);  // (rows, N)
  float* work = reinterpret_cast<float*>(smem + kTileOffset);  // (rows, N): the tile, widened
  float* window = reinterpret_cast<float*>(
      smem + kTileOffset + replay_tile_bytes(rows_per_cta, N, sizeof(S), p.buffer_len));
  constexpr int kStage = stage_tokens(sizeof(S));
  float* staged_x = window + kStagedXOffset;  // (kStage, rows_per_cta)
  Act* staged_B = reinterpret_cast<Act*>(staged_x + kStage * rows_per_cta);  // (kStage, N)
  const LanePlace at = lane_place<Ly>();
  const CtaWork w = cta_work(p, rows_per_cta);
  const int64_t slot = device_slot(p, w.row);
  if (slot < 0) return;
  S* state = static_cast<S*>(p.state) + slot * p.state_stride_slot +
             w.head * p.state_stride_head + w.first * p.state_stride_p;  // (rows, N)
  start_tile_load<S, Ly>(tile, state, p.state_stride_p, w.rows, N, barrier);

  // Every load of the window is issued here, together with the cursor: the history positions a
  // row may need (< L) are read whatever the cursor, and the cursor then selects the valid ones.
  const int64_t g = w.group;
  const int L = int(p.buffer_len);
  const int cursor = load_one(p.cursors + slot * p.cursors_stride);
  const float A = head_value(p.A, w.head, 0.f);
  const float bias = head_value(p.dt_bias, w.head, 0.f);
  const float D = head_value(p.D, w.head, 0.f);
  const float raw_dt_now =
      load_as<float>(p.dt, p.dt_dtype, w.row * p.dt_stride_batch + w.head * p.dt_stride_head);
  const Act* B_now = static_cast<const Act*>(p.B) + w.row * p.B_stride_batch +
                     g * p.B_stride_group;  // (N)
  float c[Ly::kVecsPerLane][Ly::kVec];
  load_slice<Ly>(static_cast<const Act*>(p.C) + w.row * p.C_stride_batch + g * p.C_stride_group,
                 at.part, N, c);
  const Act* x_now = static_cast<const Act*>(p.x) + w.row * p.x_stride_batch +
                     w.head * p.x_stride_head + w.first;  // (rows)
  const OutputLane<Ly> o = output_lane<Ly>(at, w);
  const bool gated = p.z != nullptr;
  const Act x_out = o.valid ? load_one(x_now + o.row) : Act{};
  const float z_out = gated && o.valid ? to_float(load_one(static_cast<const Act*>(p.z) +
                                                           w.row * p.z_stride_batch +
                                                           w.head * p.z_stride_head + w.first + o.row))
                                       : 0.f;
  // The first head of a group appends B: elements threadIdx.x and threadIdx.x + kThreads.
  const bool appends_B = w.chunk == 0 && w.head == w.group * int(p.heads_per_group);
  Act B_mine[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int n = threadIdx.x + h * kThreads;
    if (appends_B && n < N) B_mine[h] = load_one(B_now + n);
  }
  Act* x_hist = static_cast<Act*>(p.x_cache) + slot * p.xc_stride_slot +
                w.head * p.xc_stride_head + w.first;  // (L, rows), position stride xc_stride_pos
  const Act* B_hist = static_cast<const Act*>(p.B_cache) + slot * p.Bc_stride_slot +
                      g * p.Bc_stride_group;  // (L, N), position stride Bc_stride_pos
  float* dt_hist = p.dt_cache + slot * p.dtc_stride_slot + w.head * p.dtc_stride_head;  // (L)
  float raw_dt[2] = {raw_dt_now, raw_dt_now};
  if (threadIdx.x < 32) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = threadIdx.x + 32 * h;
      if (j < L - 1) raw_dt[h] = __ldg(dt_hist + j);
    }
  }
  // B_j of the first pass of tokens, and this step's B (the token at the cursor).
  Pack<Act, Ly::kVec> b_packs[Ly::kTokensPerLane][Ly::kVecsPerLane], b_now[Ly::kVecsPerLane];
  load_slice_packs<Ly>(B_now, at.part, N, b_now);
#pragma unroll
  for (int k = 0; k < Ly::kTokensPerLane; ++k) {
    const int j = pass_token<Ly>(at, 0, k);
    if (j < L - 1) {
      load_slice_packs<Ly>(B_hist + j * p.Bc_stride_pos, at.part, N, b_packs[k]);
    } else {
#pragma unroll
      for (int v = 0; v < Ly::kVecsPerLane; ++v) b_packs[k][v] = Pack<Act, Ly::kVec>{};
    }
  }
  // The output lane of row i sums weight_j (B_j . C) x_j[i] over its share of the history tokens,
  // j = share, share + kLanesPerRowSum, ...; the first ones are loaded now.
  constexpr int kShareStep = Ly::kLanesPerRowSum, kEarlyTokens = (16 + kShareStep - 1) / kShareStep;
  Act x_early[kEarlyTokens];
#pragma unroll
  for (int u = 0; u < kEarlyTokens; ++u) {
    const int j = o.share + u * kShareStep;
    if (o.valid && j < L - 1) x_early[u] = load_one(x_hist + j * p.xc_stride_pos + o.row);
  }
  if (cursor < 0 || cursor >= L) {  // a corrupt cursor: skip the row, touch nothing
    wait_tile<Ly>(barrier);         // (after the copy into this CTA's shared memory has landed)
    return;
  }

  const int count = cursor + 1;
  const bool flush = cursor == L - 1;
  const bool form_state = flush || !output_only;
  auto B_of = [&](int j) { return j < cursor ? B_hist + j * p.Bc_stride_pos : B_now; };
  if (threadIdx.x < 32) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (int(threadIdx.x) + 32 * h == cursor) raw_dt[h] = raw_dt_now;
    }
    window_weights(raw_dt, cursor, A, bias, p.dt_softplus, window);
    if (threadIdx.x == 0 && !flush && w.chunk == 0) dt_hist[cursor] = raw_dt_now;
  }
  if (!form_state) {
#pragma unroll
    for (int k = 0; k < Ly::kTokensPerLane; ++k) {
      if (pass_token<Ly>(at, 0, k) == cursor) {
#pragma unroll
        for (int v = 0; v < Ly::kVecsPerLane; ++v) b_packs[k][v] = b_now[v];
      }
    }
    pass_bc<Ly, Act>(at, 0, count, b_packs, c, window);
    for (int base = kTokensPerPass<Ly>; base < count; base += kTokensPerPass<Ly>) {
#pragma unroll
      for (int k = 0; k < Ly::kTokensPerLane; ++k) {
        const int j = pass_token<Ly>(at, base, k);
        if (j < count) load_slice_packs<Ly>(B_of(j), at.part, N, b_packs[k]);
      }
      pass_bc<Ly, Act>(at, base, count, b_packs, c, window);
    }
  }
  if (!flush) {
    if (o.valid && o.share == 0) x_hist[cursor * p.xc_stride_pos + o.row] = x_out;
    if (appends_B) {
      Act* B_slot = static_cast<Act*>(p.B_cache) + slot * p.Bc_stride_slot +
                    g * p.Bc_stride_group + cursor * p.Bc_stride_pos;  // (N)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = threadIdx.x + h * kThreads;
        if (n < N) B_slot[n] = B_mine[h];
      }
    }
  }
  auto x_of = [&](int j, int i) {
    return to_float(load_one(j < cursor ? x_hist + j * p.xc_stride_pos + i : x_now + i));
  };
  if (form_state) stage_window<Ly, kStage>(0, count, w.rows, rows_per_cta, N, x_of, B_of, staged_x, staged_B);
  wait_tile<Ly>(barrier);  // also publishes the window's weights, B_j . C and the first stage
  const float decay = window[kDecayOffset];

  float y[Ly::kRowsPerLane];
  if (form_state) {
    const bool staged_all = count <= kStage;
    if (!staged_all) widen_tile<S, Ly>(tile, work, decay, at, w, N);
    for (int j0 = 0; j0 < count; j0 += kStage) {
      if (j0 > 0) {
        __syncthreads();  // every lane is done with the previous stage
        stage_window<Ly, kStage>(j0, count, w.rows, rows_per_cta, N, x_of, B_of, staged_x, staged_B);
        __syncthreads();
      }
      const int tokens = min(kStage, count - j0);
      const bool last = j0 + kStage >= count;
#pragma unroll
      for (int k = 0; k < Ly::kRowsPerLane; ++k) {
        const int i = lane_row<Ly>(at, k, w.rows_per_warp);
        const bool valid = has_row<Ly>(at, k, w.rows_per_warp, w.rows);
        float s[Ly::kVecsPerLane][Ly::kVec];
        if (staged_all) {
          tile_row<S, Ly>(tile, i, valid, at.part, N, s);
#pragma unroll
          for (int v = 0; v < Ly::kVecsPerLane; ++v) {
#pragma unroll
            for (int e = 0; e < Ly::kVec; ++e) s[v][e] *= decay;
          }
        } else {
          work_row<Ly>(work, i, valid, at.part, N, s);
        }
#pragma unroll
        for (int t = 0; t < kStage; ++t) {
          if (t < tokens) {
            const float a = valid ? window[kWeightsOffset + j0 + t] * staged_x[t * rows_per_cta + i] : 0.f;
            float b[Ly::kVecsPerLane][Ly::kVec];
            staged_slice<Ly>(staged_B + t * N, at.part, N, b);
#pragma unroll
            for (int v = 0; v < Ly::kVecsPerLane; ++v) {
#pragma unroll
              for (int e = 0; e < Ly::kVec; ++e) s[v][e] = fmaf(a, b[v][e], s[v][e]);
            }
          }
        }
        if (!last) {
          if (valid) store_work_row<Ly>(work, i, at.part, N, s);
        } else {
          if (flush && valid) store_row<S, Ly>(state + i * p.state_stride_p, s, at.part, N);
          y[k] = dot_slice<Ly>(s, c);
        }
      }
    }
    fold_values<Ly::kLanes / 2, Ly::kRowsPerLane / 2>(y, at.part);
  } else {
    float history = 0.f;
    if (o.valid) {
#pragma unroll
      for (int u = 0; u < kEarlyTokens; ++u) {
        const int j = o.share + u * kShareStep;
        if (j < cursor)
          history = fmaf(window[kWeightsOffset + j] * window[kBCOffset + j], to_float(x_early[u]),
                         history);
      }
      for (int j = o.share + kEarlyTokens * kShareStep; j < cursor; j += kShareStep)
        history = fmaf(window[kWeightsOffset + j] * window[kBCOffset + j],
                       to_float(load_one(x_hist + j * p.xc_stride_pos + o.row)), history);
      if (o.share == 0)  // this step's token
        history = fmaf(window[kWeightsOffset + cursor] * window[kBCOffset + cursor],
                       to_float(x_out), history);
    }
#pragma unroll
    for (int k = 0; k < Ly::kRowsPerLane; ++k) {
      float s[Ly::kVecsPerLane][Ly::kVec];
      tile_row<S, Ly>(tile, lane_row<Ly>(at, k, w.rows_per_warp),
                      has_row<Ly>(at, k, w.rows_per_warp, w.rows), at.part, N, s);
      y[k] = dot_slice<Ly>(s, c);
    }
    fold_values<Ly::kLanes / 2, Ly::kRowsPerLane / 2>(y, at.part);
    y[0] = fmaf(decay, y[0], history);
  }
  const float y_out = sum_row_lanes<Ly::kLanesPerRowSum>(y[0]);
  if (o.valid && o.share == 0) {
    Act* out = static_cast<Act*>(p.out) + w.row * p.out_stride_batch +
               w.head * p.out_stride_head + w.first;  // (rows)
    store_output(out, o.row, y_out, D, to_float(x_out), gated, z_out);
  }
}

}  // namespace replayssm::cuda
