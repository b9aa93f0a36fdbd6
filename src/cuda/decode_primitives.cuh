// The building blocks of the decode kernels (mamba2_kernels.cuh) and the speculative ones
// (mamba2_spec_kernels.cuh): 16-byte packs, the bulk copy engine, the row layouts' slices and
// reductions, the state tile, and the window's weights. All arithmetic is fp32 FMA on values
// widened from their storage type, but for one fold on the tensor cores whose products are exact.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "api/params.hpp"
#include "common/mamba2_math.hpp"
#include "common/rounding.hpp"
#include "cuda/row_layout.hpp"

namespace replayssm::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

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

// A pack widened to fp32. A 32-bit word holds two bf16 values: the low one widens by a shift and
// the high one by a mask, one instruction each (element by element takes an extract more).
template <typename T, int K> __device__ __forceinline__ void widen_pack(const Pack<T, K> in, float (&out)[K]) {
  if constexpr (std::is_same_v<T, BFloat16> && K % 2 == 0) {
#pragma unroll
    for (int w = 0; w < K / 2; ++w) {
      const uint32_t pair = reinterpret_cast<const uint32_t*>(&in)[w];
      out[2 * w] = __uint_as_float(pair << 16);
      out[2 * w + 1] = __uint_as_float(pair & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int e = 0; e < K; ++e) out[e] = to_float(in.v[e]);
  }
}

// ---- The bulk copy engine (sm_90): global -> shared, completing on an mbarrier. ----

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return unsigned(__cvta_generic_to_shared(p));
}

// Orders this CTA's shared-memory accesses before it (a barrier's set-up, a tile's reads a CTA
// barrier ago) ahead of the copy engine's next accesses.
__device__ __forceinline__ void fence_for_copy_engine() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// One arrival (the issuing thread's) plus the bytes of the copies completes the barrier's phase 0.
__device__ __forceinline__ void barrier_init(uint64_t* barrier) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(barrier)) : "memory");
  fence_for_copy_engine();
}

__device__ __forceinline__ void barrier_expect_bytes(uint64_t* barrier, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                   shared_address(barrier)),
               "r"(bytes)
               : "memory");
}

// The L2 policy of a tile's copy. ReplaySSM reads each checkpoint row once a step: evict-first
// keeps the step's small data (the dot kernel's dots, the window's history and inputs) in the L2
// for the kernels after it (H200, Nemotron-H, batch 128: a 16-bit checkpoint's step 91.0 -> 89.2
// us, notes/cuda.md v19). The baselines' states keep the normal policy (slower with evict-first).
enum class L2Hint { kNormal, kEvictFirst };

__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, unsigned bytes,
                                                    uint64_t* barrier, L2Hint hint) {
  if (hint == L2Hint::kEvictFirst) {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], "
        "%4;" ::"r"(shared_address(dst)),
        "l"(src), "r"(bytes), "r"(shared_address(barrier)), "l"(policy)
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            shared_address(dst)),
        "l"(src), "r"(bytes), "r"(shared_address(barrier))
        : "memory");
  }
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

// ---- Asynchronous copies (sm_80): global -> shared, holding no registers; each thread waits
// for its own. ----

template <typename T, int K> __device__ __forceinline__ void copy_pack_async(Pack<T, K>* dst, const T* src) {
  constexpr int kBytes = int(sizeof(T)) * K;
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_address(dst) + 16 * i),
                   "l"(reinterpret_cast<const char*>(src) + 16 * i)
                   : "memory");
  } else {
    static_assert(kBytes == 4 || kBytes == 8, "asynchronous copies move 4, 8 or 16 bytes");
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(shared_address(dst)), "l"(src), "n"(kBytes)
                 : "memory");
  }
}
// This thread's asynchronous copies have landed and are visible to it.
__device__ __forceinline__ void wait_async_copies() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// Closes a group of this thread's asynchronous copies; groups land in the order they were closed.
__device__ __forceinline__ void close_async_group() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Every group of this thread's asynchronous copies but the last closed one has landed.
__device__ __forceinline__ void wait_async_groups_but_last() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

// The bytes of dynamic shared memory the CTA was launched with.
__device__ __forceinline__ uint32_t dynamic_smem_bytes() {
  uint32_t bytes;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
  return bytes;
}

// Programmatic dependent launch (sm_90): each kernel of the split path after the first is launched
// while the one before still runs. Both are no-ops in a kernel launched without the attribute.
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

// After a row-group reduction every lane of the group holds all kRows sums of the batch; lane k
// takes row k's.
template <typename Ly> __device__ __forceinline__ float lane_row_sum(const float (&y)[Ly::kRows], int lane) {
  float mine = y[0];
#pragma unroll
  for (int k = 1; k < Ly::kRows; ++k) {
    if (lane == k) mine = y[k];
  }
  return mine;
}

// Lane k < kRows of each row group finishes row k of the batch: out_i = (y_i + D x_i) * silu(z_i),
// rounded to Act. x and z hold the chunk's rows.
template <typename Ly, typename Act>
__device__ __forceinline__ void store_outputs(Act* out, const float (&y)[Ly::kRows], int batch,
                                              int group, int lane, int rows, float D,
                                              const float* x, const float* z) {
  const float mine = lane_row_sum<Ly>(y, lane);
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
  for (int v = 0; v < Ly::kVecsPerLane; ++v) widen_pack(in[v], out[v]);
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

// One 16-byte piece of fp32 in shared memory (16-byte aligned): four values out, or four values
// of type T widened in.
__device__ __forceinline__ void load_piece(const float* src, float* out) {
  const float4 q = *reinterpret_cast<const float4*>(src);
  out[0] = q.x;
  out[1] = q.y;
  out[2] = q.z;
  out[3] = q.w;
}
template <typename T> __device__ __forceinline__ void store_piece(float* dst, const T* in) {
  *reinterpret_cast<float4*>(dst) = make_float4(to_float(in[0]), to_float(in[1]), to_float(in[2]), to_float(in[3]));
}

// N-vectors of fp32 staged in shared memory (B and C of the window's tokens). On the vectorised
// layouts they are kept in lane order: piece q (4 floats) of lane l's slice sits at
// (q kLanes + l) 4, so that the lanes of a row group read 16 consecutive bytes each and a 16-bit
// state's 8-element slices (32 bytes a lane) read without bank conflicts (with 4-element slices
// this is the natural order). The generic layout keeps the natural order.
template <typename Ly> constexpr bool kLaneOrder = !Ly::kMasked && Ly::kVec % 4 == 0;

// In lane order: where element e of vector v of lane l's slice sits.
template <typename Ly> __device__ __forceinline__ int lane_order_position(int v, int e, int lane) {
  return ((v * Ly::kVec + e) / 4 * Ly::kLanes + lane) * 4 + e % 4;
}

// Where element n of a staged N-vector sits.
template <typename Ly> __device__ __forceinline__ int shared_position(int n) {
  if constexpr (kLaneOrder<Ly>) {
    return lane_order_position<Ly>(n / (Ly::kVec * Ly::kLanes), n % Ly::kVec, n / Ly::kVec % Ly::kLanes);
  } else {
    return n;
  }
}

// This lane's slice of a staged N-vector (zero past N); 16-byte loads on the vectorised layouts
// (src 16-byte aligned: the shared arrays start so and N is a multiple of 4).
template <typename Ly>
__device__ __forceinline__ void shared_slice(const float* src, int lane, int64_t N,
                                             float (&out)[Ly::kVecsPerLane][Ly::kVec]) {
#pragma unroll
  for (int v = 0; v < Ly::kVecsPerLane; ++v) {
    if constexpr (kLaneOrder<Ly>) {
#pragma unroll
      for (int e = 0; e < Ly::kVec; e += 4) load_piece(src + lane_order_position<Ly>(v, e, lane), out[v] + e);
    } else {
      const int n = first_element<Ly>(v, lane);
#pragma unroll
      for (int e = 0; e < Ly::kVec; ++e) out[v][e] = !Ly::kMasked || n + e < N ? src[n + e] : 0.f;
    }
  }
}

// Stages this lane's slice of an N-vector, widened to fp32, where shared_slice reads it.
template <typename Ly, typename T>
__device__ __forceinline__ void store_shared_slice(float* dst, const Pack<T, Ly::kVec> (&in)[Ly::kVecsPerLane],
                                                   int lane, int64_t N) {
#pragma unroll
  for (int v = 0; v < Ly::kVecsPerLane; ++v) {
    if constexpr (kLaneOrder<Ly>) {
#pragma unroll
      for (int e = 0; e < Ly::kVec; e += 4) store_piece(dst + lane_order_position<Ly>(v, e, lane), in[v].v + e);
    } else {
      const int n = first_element<Ly>(v, lane);
#pragma unroll
      for (int e = 0; e < Ly::kVec; ++e)
        if (!Ly::kMasked || n + e < N) dst[n + e] = to_float(in[v].v[e]);
    }
  }
}

// Index, inside its chunk, of row k of batch `batch` of this thread's row group.
template <typename Ly> __device__ __forceinline__ int chunk_row(int batch, int k, int group) {
  return batch * Ly::kBatchRows + k * Ly::kRowGroups + group;
}

// Elements of one state row in the tile (and in the state for the vectorised layouts).
template <typename Ly> __device__ __forceinline__ int64_t row_elements(int64_t N) {
  return Ly::kMasked ? N : int64_t(Ly::kCoverN);
}

// Thread 0 sets up a tile's barrier (vectorised layouts). Done at kernel entry, before any load is
// in flight, the set-up's proxy fence does not make the tile's copy wait for this thread's loads.
template <typename Ly> __device__ __forceinline__ void init_tile_barrier(uint64_t* barrier) {
  if (!Ly::kMasked && threadIdx.x == 0) barrier_init(barrier);
}

// How a tile's copy finds its barrier (vectorised layouts):
// - kSetUp: thread 0 sets it up with the copy (phase 0);
// - kReady: init_tile_barrier set it up at kernel entry (phase 0);
// - kNextPhase: set up at kernel entry for a CTA that loads one tile after another into the same
//   shared memory, each waited for and read a CTA barrier before the next copy: the copy completes
//   the barrier's next phase. (Invalidated and set up again between tiles, the barrier no longer
//   orders the tiles' copies for racecheck: write-after-write hazards; notes/cuda.md v17.)
enum class TileBarrier { kSetUp, kReady, kNextPhase };

// Starts loading the chunk's state rows (rows x N, row stride stride_p) into `tile`: the bulk
// copy engine for the vectorised layouts (wait_tile before use, with the phase the copy
// completes), element by element for the generic one (visible after the next __syncthreads).
template <typename S, typename Ly>
__device__ __forceinline__ void start_tile_load(S* tile, const S* state, int64_t stride_p,
                                                int rows, int64_t N, uint64_t* barrier, L2Hint hint,
                                                TileBarrier how) {
  if constexpr (Ly::kMasked) {
    const int count = rows * int(N);
    for (int idx = threadIdx.x; idx < count; idx += kThreads) {
      const int i = idx / int(N), n = idx - i * int(N);
      tile[idx] = load_one(state + i * stride_p + n);
    }
  } else {
    if (threadIdx.x == 0) {
      const unsigned row_bytes = unsigned(Ly::kCoverN * sizeof(S));
      if (how == TileBarrier::kSetUp) barrier_init(barrier);
      if (how == TileBarrier::kNextPhase) fence_for_copy_engine();  // after the tile before's reads
      barrier_expect_bytes(barrier, row_bytes * unsigned(rows));
      if (stride_p == Ly::kCoverN) {
        bulk_copy_to_shared(tile, state, row_bytes * unsigned(rows), barrier, hint);
      } else {
        for (int i = 0; i < rows; ++i)
          bulk_copy_to_shared(tile + i * Ly::kCoverN, state + i * stride_p, row_bytes, barrier, hint);
      }
    }
  }
}

// Starts the bulk copy of the tile rows [first, first + count) of a tile of `rows` state rows of
// each of consecutive heads (head stride stride_head, row stride stride_p, rows of N elements;
// tile row k rows + i is row i of head k) into `tile` from its start: the split paths' dot kernels,
// vectorised layouts only. The copy from row 0 sets the barrier up (wait_tile before use) unless
// init_tile_barrier did at entry (barrier_ready); one from a later row, once the one before has
// landed and been read, completes its next phase. kOneCopy (standard decode's dot kernel and its
// folds): rows that are contiguous in memory (one head's chunk, or whole heads of a contiguous
// state) in one copy, without the loop's address arithmetic. The speculative dot kernel leaves it
// off: there the branch made the bf16 T <= 4 instantiation spill, 2-4% slower (notes/cuda.md v44).
template <bool kOneCopy = false, typename S>
__device__ __forceinline__ void start_heads_tile_load(S* tile, const S* state, int64_t stride_head,
                                                      int64_t stride_p, int rows, int first, int count,
                                                      int N, uint64_t* barrier, L2Hint hint,
                                                      bool barrier_ready = false) {
  if (threadIdx.x != 0) return;
  const unsigned row_bytes = unsigned(N * sizeof(S));
  if (first == 0) {
    if (!barrier_ready) barrier_init(barrier);
  } else {  // the reads of the part before (a CTA barrier ago), ordered before the copy engine's writes
    fence_for_copy_engine();
  }
  barrier_expect_bytes(barrier, row_bytes * unsigned(count));
  if (kOneCopy && stride_p == N && (first + count <= rows || stride_head == int64_t(rows) * N)) {
    bulk_copy_to_shared(tile, state + int64_t(first) * N, row_bytes * unsigned(count), barrier, hint);
    return;
  }
  for (int k = first / rows; k * rows < first + count; ++k) {
    const int begin = max(first, k * rows), end = min(first + count, (k + 1) * rows);
    S* dst = tile + (begin - first) * N;
    const S* src = state + k * stride_head + (begin - k * rows) * stride_p;
    if (stride_p == N) {
      bulk_copy_to_shared(dst, src, row_bytes * unsigned(end - begin), barrier, hint);
    } else {
      for (int i = 0; i < end - begin; ++i) bulk_copy_to_shared(dst + i * N, src + i * stride_p, row_bytes, barrier, hint);
    }
  }
}

// phase: of the barrier, for a tile copied in parts on one barrier (start_heads_tile_load).
template <typename Ly> __device__ __forceinline__ void wait_tile(uint64_t* barrier, unsigned phase = 0) {
  if constexpr (!Ly::kMasked) barrier_wait(barrier, phase & 1u);
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
      widen_pack(*reinterpret_cast<const Pack<S, Ly::kVec>*>(row + n), out[v]);
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

// A scalar of dtype float32, float16 or bfloat16 (dt and the per-head parameters) as stored: its
// load is not waited for until it is widened. (Loaded and widened in one switch on the dtype, a
// scalar was waited for inside its case, before the next load was issued.)
struct StoredScalar {
  uint32_t bits;
  DType dtype;
};

__device__ __forceinline__ StoredScalar load_stored(const void* data, DType dtype, int64_t i) {
  const uint32_t bits = dtype == DType::kFloat32 ? __ldg(static_cast<const unsigned*>(data) + i)
                                                 : __ldg(static_cast<const unsigned short*>(data) + i);
  return {bits, dtype};
}

__device__ __forceinline__ float widen(StoredScalar s) {
  if (s.dtype == DType::kFloat16) return fp16_to_float(uint16_t(s.bits));
  return __uint_as_float(s.dtype == DType::kBFloat16 ? s.bits << 16 : s.bits);
}

__device__ __forceinline__ StoredScalar load_head_scalar(const HeadScalar& s, int64_t h, float absent) {
  return s.data ? load_stored(s.data, s.dtype, h * s.stride) : StoredScalar{__float_as_uint(absent), DType::kFloat32};
}

__device__ __forceinline__ float head_value(const HeadScalar& s, int64_t h, float absent) {
  return widen(load_head_scalar(s, h, absent));
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

__device__ __forceinline__ CtaWork cta_work(const Mamba2Params& p, int rows_per_cta,
                                            int row = int(blockIdx.y)) {
  const unsigned chunks = unsigned((int(p.head_dim) + rows_per_cta - 1) / rows_per_cta);
  CtaWork w;
  w.chunk = int(blockIdx.x % chunks);
  w.head = int(blockIdx.x / chunks);
  w.group = w.head / int(p.heads_per_group);
  w.row = row;
  w.first = w.chunk * rows_per_cta;
  w.rows = min(rows_per_cta, int(p.head_dim) - w.first);
  return w;
}

// The state rows of a CTA's (row, head, chunk) in `slot`, from the chunk's first row.
template <typename S>
__device__ __forceinline__ S* chunk_state(const Mamba2Params& p, const CtaWork& w, int64_t slot) {
  return static_cast<S*>(p.state) + slot * p.state_stride_slot + w.head * p.state_stride_head +
         w.first * p.state_stride_p;
}

// The rows a CTA of a split path's dot kernel reads: blockIdx.x = block of heads_per_cta heads of
// one group * chunks + chunk of `rows` head_dim rows, blockIdx.y = batch row.
struct DotCta {
  int row, first_head;
  int first;  // first head_dim row of the chunk
  int rows;   // head_dim rows in the chunk
};
__device__ __forceinline__ DotCta dot_cta(int head_dim, int heads_per_cta, int rows) {
  const int chunks = (head_dim + rows - 1) / rows;
  DotCta d;
  d.row = int(blockIdx.y);
  d.first_head = int(blockIdx.x) / chunks * heads_per_cta;
  d.first = int(blockIdx.x) % chunks * rows;
  d.rows = min(rows, head_dim - d.first);
  return d;
}

// Thread 0 waits for the tile while the others wait at the CTA barrier (no spinning warps).
template <typename Ly> __device__ __forceinline__ void wait_tile_all(uint64_t* barrier, unsigned phase = 0) {
  if (threadIdx.x == 0) wait_tile<Ly>(barrier, phase);
  __syncthreads();
}

// One warp: the effective dt of tokens lane and lane + 32 from their raw dt, those up to `last`
// only (the others are not weighed: zero, without the softplus).
__device__ __forceinline__ void window_dt(const float (&raw_dt)[2], int last, float bias, bool dt_softplus,
                                          float (&dt)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half)
    dt[half] = int(threadIdx.x % 32) + 32 * half <= last ? effective_dt(raw_dt[half], bias, dt_softplus) : 0.f;
}

// One warp: the weights of the window's tokens [first, last] (at most 64; two a lane, from the
// effective dt of tokens lane and lane + 32: effective_dt of the raw values), weight_j = dt_j
// exp(A sum_{j<i<=last} dt_i) (into weights[0, 64), zero outside the window), and the window's
// decay exp(A sum_j dt_j) (into *decay). The sums over later tokens are backward suffix sums,
// never differences of prefix sums. Callers that weigh several windows of the same tokens convert
// each raw dt once.
__device__ __forceinline__ void window_weights(const float (&token_dt)[2], int first, int last, float A,
                                               float* weights, float* decay) {
  const int lane = threadIdx.x % 32;
  float dt[2], later[2], total[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int j = lane + 32 * half;
    dt[half] = j >= first && j <= last ? token_dt[half] : 0.f;
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

// window_weights of the tokens [first, count + w) for each of `windows` windows w < kWindows that
// share their first token, count + windows - 1 <= kWidth (16 or 32), 32 / kWidth heads at once:
// lanes kWidth s + j take token j of the head of segment s (its effective dt: token_dt; weights and
// decays null: a segment without a head). Window w's weights go to weights + w * weights_stride and
// its decay to decays[w]. The same sums in the same order as window_weights, whose other lanes
// only add zeros for such a window: the same weights to the bit. The windows' scans go level by
// level together, and lane w forms window w's decay.
template <int kWidth, int kWindows>
__device__ __forceinline__ void window_weights_short(float token_dt, int first, int count, int windows, float A,
                                                     float* weights, int weights_stride, float* decays) {
  static_assert(kWidth == 16 || kWidth == 32, "a segment is half a warp or a whole one");
  static_assert(kWindows <= kWidth, "a lane forms each window's decay");
  const int j = threadIdx.x % kWidth;
  float dt[kWindows], total[kWindows];  // total becomes sum_{i>=j} dt_i
#pragma unroll
  for (int w = 0; w < kWindows; ++w) {
    dt[w] = j >= first && j < count + w ? token_dt : 0.f;
    total[w] = dt[w];
  }
#pragma unroll
  for (int offset = 1; offset < kWidth; offset *= 2) {
#pragma unroll
    for (int w = 0; w < kWindows; ++w) {
      const float v = __shfl_down_sync(kFullMask, total[w], offset, kWidth);
      if (j + offset < kWidth) total[w] += v;
    }
  }
  float decay_sum = 0.f;  // lane w: window w's sum, from the segment's first lane
#pragma unroll
  for (int w = 0; w < kWindows; ++w) {
    float later = __shfl_down_sync(kFullMask, total[w], 1, kWidth);
    if (j == kWidth - 1) later = 0.f;
    if (weights && w < windows) weights[w * weights_stride + j] = dt[w] * expf(A * later);
    const float sum = __shfl_sync(kFullMask, total[w], 0, kWidth);
    if (j == w) decay_sum = sum;
  }
  if (decays && j < windows) decays[j] = expf(A * decay_sum);
}
// One window: [first, count).
template <int kWidth>
__device__ __forceinline__ void window_weights_short(float token_dt, int first, int count, float A, float* weights,
                                                     float* decay) {
  window_weights_short<kWidth, 1>(token_dt, first, count, 1, A, weights, 0, decay);
}

// The baseline's step of one state row slice: s = decay s + xdt b.
template <typename Ly>
__device__ __forceinline__ void state_step(float (&s)[Ly::kVecsPerLane][Ly::kVec], float decay,
                                           float xdt, const float (&b)[Ly::kVecsPerLane][Ly::kVec]) {
#pragma unroll
  for (int v = 0; v < Ly::kVecsPerLane; ++v) {
#pragma unroll
    for (int e = 0; e < Ly::kVec; ++e) s[v][e] = fmaf(xdt, b[v][e], decay * s[v][e]);
  }
}

// Adds the tokens [begin, end) of a window to one state row slice: s += weight_of(j) B_j, with
// B_j (type Act, as stored) at B_of(j), two tokens' loads in flight at a time.
template <typename Ly, typename Act, typename BOf, typename WeightOf>
__device__ __forceinline__ void add_tokens(float (&s)[Ly::kVecsPerLane][Ly::kVec], int begin, int end,
                                           int lane, int64_t N, const BOf& B_of,
                                           const WeightOf& weight_of) {
  constexpr int kTokensInFlight = 2;
  for (int j0 = begin; j0 < end; j0 += kTokensInFlight) {
    Pack<Act, Ly::kVec> bj[kTokensInFlight][Ly::kVecsPerLane];
#pragma unroll
    for (int t = 0; t < kTokensInFlight; ++t) {
      if (j0 + t < end) load_slice_packs<Ly>(B_of(j0 + t), lane, N, bj[t]);
    }
#pragma unroll
    for (int t = 0; t < kTokensInFlight; ++t) {
      const int j = j0 + t;
      if (j >= end) break;
      float b[Ly::kVecsPerLane][Ly::kVec];
      widen_slice<Ly>(bj[t], b);
      const float a = weight_of(j);
#pragma unroll
      for (int v = 0; v < Ly::kVecsPerLane; ++v) {
#pragma unroll
        for (int e = 0; e < Ly::kVec; ++e) s[v][e] = fmaf(a, b[v][e], s[v][e]);
      }
    }
  }
}

// A flush row's window as a split path's dot kernel stages it, as stored, at the end of its tile's
// shared memory (dot_flush_window_bytes): per head of the tile its weights (kMaxBufferLen floats)
// and its decay (the first of four floats), per token its B (row pitch B_pitch) and its x of every
// tile row (row pitch x_pitch, column = tile row).
template <typename Act> struct StagedFold {
  const float* weights;
  const float* head_s;
  const Act* B;
  const Act* x;
  int B_pitch, x_pitch, tokens;
};

// This lane's slice of a row staged as stored in shared memory (16-byte aligned), widened.
template <typename Ly, typename Act>
__device__ __forceinline__ void stored_slice(const Act* row, int lane, float (&out)[Ly::kVecsPerLane][Ly::kVec]) {
  Pack<Act, Ly::kVec> packs[Ly::kVecsPerLane];
#pragma unroll
  for (int v = 0; v < Ly::kVecsPerLane; ++v)
    packs[v] = *reinterpret_cast<const Pack<Act, Ly::kVec>*>(row + first_element<Ly>(v, lane));
  widen_slice<Ly>(packs, out);
}

// Folds a flush row's staged window into the checkpoint rows of a dot kernel's tile (tile_rows
// rows: `rows` of each of consecutive heads, from `state` on),
//   S_i = decay S0_i + sum_{j < tokens} weight_j x_j[i] B_j,
// and stores them rounded to nearest. The caller asked for the first part_rows tile rows
// (start_heads_tile_load from row 0) and waited for them; each later part lands where the one
// before was, while that one's last batch of rows folds from registers. Then, per batch of
// folded rows, finished(s, first, next, batch): the part is the tile rows [first, next), and s[k]
// is its row chunk_row(batch, k, group) (none past next). kOneCopy: start_heads_tile_load's, for
// the later parts' copies.
template <typename S, typename Ly, bool kOneCopy = false, typename Act, typename Finished>
__device__ __forceinline__ void fold_staged_tile(S* tile, S* state, int64_t stride_head, int64_t stride_p, int rows,
                                                 int tile_rows, int part_rows, int N, uint64_t* barrier,
                                                 const StagedFold<Act>& f, const Finished& finished) {
  const int lane = threadIdx.x % Ly::kLanes, group = threadIdx.x / Ly::kLanes;
  FlushRandomBits nearest(0, 0, 0, 0);  // unused: the split paths round to nearest
  for (int first = 0, part = 0; first < tile_rows; first += part_rows, ++part) {
    const int count = min(part_rows, tile_rows - first), next = first + count;
    const int batches = (count + Ly::kBatchRows - 1) / Ly::kBatchRows;
    if (part > 0) wait_tile_all<Ly>(barrier, part);
    for (int batch = 0; batch < batches; ++batch) {
      float s[Ly::kRows][Ly::kVecsPerLane][Ly::kVec];
      int t[Ly::kRows], k[Ly::kRows];  // tile row, head
#pragma unroll
      for (int q = 0; q < Ly::kRows; ++q) {
        const int i = chunk_row<Ly>(batch, q, group);
        t[q] = first + i;
        k[q] = min(t[q], tile_rows - 1) / rows;
        tile_row<S, Ly>(tile, i, count, lane, N, s[q]);
        const float decay = f.head_s[4 * k[q]];
#pragma unroll
        for (int v = 0; v < Ly::kVecsPerLane; ++v) {
#pragma unroll
          for (int e = 0; e < Ly::kVec; ++e) s[q][v][e] *= decay;
        }
      }
      if (batch == batches - 1 && next < tile_rows) {  // the part is in registers: the next one may land
        __syncthreads();
        start_heads_tile_load<kOneCopy>(tile, state, stride_head, stride_p, rows, next,
                                        min(part_rows, tile_rows - next), N, barrier, L2Hint::kEvictFirst);
      }
      // Every lane of a row group needs the same weight_j x_j[i] of its rows: lane l forms those of
      // token j0 + l once, and the group's lanes read them from it by a shuffle (notes/cuda.md v33).
      for (int j0 = 0; j0 < f.tokens; j0 += Ly::kLanes) {
        float mine[Ly::kRows];
        const int j = j0 + lane;
#pragma unroll
        for (int q = 0; q < Ly::kRows; ++q)
          mine[q] = j < f.tokens && t[q] < next
                        ? f.weights[k[q] * kMaxBufferLen + j] * to_float(f.x[j * f.x_pitch + t[q]])
                        : 0.f;
        const int block = min(Ly::kLanes, f.tokens - j0);
        // Two tokens in flight; past 32 bytes of B a lane (fp32 activations; a 16-bit state at N =
        // 256) they spill under the dot kernels' register cap: one at a time.
        constexpr int kTokensInFlight = Ly::kVecsPerLane * Ly::kVec * sizeof(Act) > 32 ? 1 : 2;
#pragma unroll kTokensInFlight
        for (int e = 0; e < block; ++e) {
          float b[Ly::kVecsPerLane][Ly::kVec];
          stored_slice<Ly>(f.B + (j0 + e) * f.B_pitch, lane, b);
#pragma unroll
          for (int q = 0; q < Ly::kRows; ++q) state_step<Ly>(s[q], 1.f, __shfl_sync(kFullMask, mine[q], e, Ly::kLanes), b);
        }
      }
#pragma unroll
      for (int q = 0; q < Ly::kRows; ++q) {
        const int i = t[q] - k[q] * rows;
        store_checkpoint_row<S, Ly>(state + k[q] * stride_head + i * stride_p, nullptr, t[q] < next, s[q], lane, N,
                                    false, nearest, 0);
      }
      finished(s, first, next, batch);
    }
  }
}

// ---- A 4- or 2-byte state's fold on the tensor cores (sm_80 mma.sync). ----

// The split paths fold a 4- or 2-byte state with bf16 activations and N <= 128 on the tensor cores:
// B_j is exact in bf16, and each weight_j x_j[i] (its fp32 product, as the CUDA-core fold forms it)
// goes in as three bf16 terms whose sum is that product to within 2^-27 of it, so the products are
// fp32's and only the order of the sums differs (a 2-byte state is then rounded as there).
template <typename S, typename Act, typename Ly>
constexpr bool kTensorCoreFold = (sizeof(S) == 4 || sizeof(S) == 2) && std::is_same_v<Act, BFloat16> &&
                                 !Ly::kMasked && Ly::kCoverN <= 128;
// The launchers take it where a flush folds more than this many tokens: at one block of 16 tokens
// it was 0.2-1.2% slower than the CUDA-core fold (L = 16), at 28-32 tokens 0.2-3.8% faster (L =
// 32; notes/cuda.md v35).
constexpr int64_t kTensorFoldMinTokens = 16;

// The bf16 pairs (low half: p) of three terms whose sums are p and q to within 2^-27 of them.
__device__ __forceinline__ void split_bf16x3(float p, float q, uint32_t (&terms)[3]) {
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    uint32_t pair;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(pair) : "f"(q), "f"(p));
    terms[k] = pair;
    p -= __uint_as_float(pair << 16);
    q -= __uint_as_float(pair & 0xffff0000u);
  }
}

// d += a b: a 16 x 16 bf16 block a, a 16 x 8 one b (b0, b1), fp32 d, in mma.m16n8k16's fragments.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8 x 8 blocks of 16-bit values, each transposed: lane l gives the address of row l % 8 of
// block l / 8 (16-byte aligned) and gets, of each block, rows 2 (l % 4) and the next of column l / 4.
__device__ __forceinline__ void load_blocks_transposed(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row))
               : "memory");
}

// fold_staged_tile on the tensor cores (kTensorCoreFold), the same contract but for what it hands
// on: per folded row, row_done(tile row, y), y[d] = S_i . c_at(d, n) over n for d < dots. Each warp
// takes 8 rows of a part at a time over all N columns, as S^T = decay S0^T + B^T (w x): the state
// columns are mma's rows (16 a block, B^T's fragments by ldmatrix from the staged B), the tile rows
// its columns (8, the w x fragments formed in registers), the decayed rows its accumulators. A
// part's rows are in registers before the next part's copy is asked for, so that the fold runs
// while it lands; the folded rows are stored and their dots taken from the fragments.
template <typename Ly, int kMaxDots, bool kOneCopy = false, typename S, typename Act, typename CAt, typename RowDone>
__device__ __forceinline__ void fold_staged_tile_on_tensor_cores(S* tile, S* state, int64_t stride_head,
                                                                 int64_t stride_p, int rows, int tile_rows,
                                                                 int part_rows, int N, uint64_t* barrier,
                                                                 const StagedFold<Act>& f, int dots,
                                                                 const CAt& c_at, const RowDone& row_done) {
  constexpr int kWarps = kThreads / 32, kWarpRows = 8, kColBlocks = Ly::kCoverN / 16;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  for (int first = 0, part = 0; first < tile_rows; first += part_rows, ++part) {
    const int count = min(part_rows, tile_rows - first), next = first + count;
    const int rounds = (count + kWarps * kWarpRows - 1) / (kWarps * kWarpRows);
    if (part > 0) wait_tile_all<Ly>(barrier, part);
    for (int round = 0; round < rounds; ++round) {
      const int base = round * kWarps * kWarpRows + warp * kWarpRows;  // the warp's rows in the part
      // Accumulator rows: this lane's 2t and 2t + 1 of the warp's 8 (columns g and g + 8 of each
      // block); w x rows: its g.
      int u[2], head[2];
      bool live[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        u[e] = base + 2 * t + e;
        live[e] = u[e] < count;
        head[e] = (first + min(u[e], count - 1)) / rows;
      }
      float acc[kColBlocks][4];  // (column g: rows 2t, 2t + 1; column g + 8: the same)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float decay = f.head_s[4 * head[e]];
#pragma unroll
        for (int m = 0; m < kColBlocks; ++m) {
#pragma unroll
          for (int h = 0; h < 2; ++h)
            acc[m][2 * h + e] = live[e] ? decay * to_float(tile[u[e] * N + 16 * m + g + 8 * h]) : 0.f;
        }
      }
      if (round == rounds - 1 && next < tile_rows) {  // the part is in registers: the next one may land
        __syncthreads();
        start_heads_tile_load<kOneCopy>(tile, state, stride_head, stride_p, rows, next,
                                        min(part_rows, tile_rows - next), N, barrier, L2Hint::kEvictFirst);
      }
      const int wx_row = base + g;
      const bool wx_live = wx_row < count;
      const int wx_head = (first + min(wx_row, count - 1)) / rows;
      for (int k0 = 0; k0 < f.tokens; k0 += 16) {
        uint32_t b[3][2];  // term (hi, mid, lo); tokens k0 + 2t and the next, then 8 later
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float v[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int j = k0 + 8 * h + 2 * t + e;
            v[e] = wx_live && j < f.tokens ? f.weights[wx_head * kMaxBufferLen + j] *
                                                 to_float(f.x[j * f.x_pitch + first + wx_row])
                                           : 0.f;
          }
          uint32_t terms[3];
          split_bf16x3(v[0], v[1], terms);
#pragma unroll
          for (int k = 0; k < 3; ++k) b[k][h] = terms[k];
        }
        // Tokens past the window read a staged one (finite): their w x terms are zero.
        const Act* B_row = f.B + min(k0 + lane / 16 * 8 + lane % 8, f.tokens - 1) * f.B_pitch + lane / 8 % 2 * 8;
#pragma unroll
        for (int m = 0; m < kColBlocks; ++m) {
          uint32_t a[4];
          load_blocks_transposed(a, B_row + 16 * m);
#pragma unroll
          for (int k = 2; k >= 0; --k) mma_bf16(acc[m], a, b[k][0], b[k][1]);
        }
      }
      float y[2][kMaxDots];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = first + u[e] - head[e] * rows;
        S* row = state + head[e] * stride_head + i * stride_p;
#pragma unroll
        for (int m = 0; m < kColBlocks; ++m) {
#pragma unroll
          for (int h = 0; h < 2; ++h)
            if (live[e]) row[16 * m + g + 8 * h] = from_float<S>(acc[m][2 * h + e]);
        }
#pragma unroll
        for (int d = 0; d < kMaxDots; ++d) y[e][d] = 0.f;
      }
#pragma unroll
      for (int d = 0; d < kMaxDots; ++d) {
        if (d >= dots) break;
#pragma unroll
        for (int m = 0; m < kColBlocks; ++m) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float c = c_at(d, 16 * m + g + 8 * h);
#pragma unroll
            for (int e = 0; e < 2; ++e) y[e][d] = fmaf(c, acc[m][2 * h + e], y[e][d]);
          }
        }
      }
#pragma unroll
      for (int offset = 4; offset < 32; offset *= 2) {  // over g: the lanes of a row
#pragma unroll
        for (int e = 0; e < 2; ++e) {
#pragma unroll
          for (int d = 0; d < kMaxDots; ++d) y[e][d] += __shfl_xor_sync(kFullMask, y[e][d], offset);
        }
      }
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (g == 0 && live[e]) row_done(first + u[e], y[e]);
    }
  }
}

// ---- A bf16 checkpoint's dots on the tensor cores (sm_80 mma.sync). ----

// The speculative dot kernel takes the dots S_i . C_t of a bf16 checkpoint with bf16 activations
// on the tensor cores: every product of two bf16 values is exact and the sums are fp32, as on the
// CUDA cores (only their order differs), in a fraction of the instructions. (Standard decode's one
// column would leave seven eighths of each mma idle: measured slower there.)
template <typename S, typename Act, typename Ly>
constexpr bool kTensorCoreDots = std::is_same_v<S, BFloat16> && std::is_same_v<Act, BFloat16> && !Ly::kMasked;

// Which state column stands for which of mma.m16n8k16's k is free as long as the tile's rows (A)
// and the C_t (B's columns) agree. In each block of 32 columns, lane (g, q) (g = lane / 4, q = lane %
// 4) takes the eight columns from 8 q in one 16-byte access: columns 8 q + 4 s + {0, 1} are its k =
// 2 q, 2 q + 1 and columns 8 q + 4 s + {2, 3} its k = 2 q + 8, 2 q + 9 of the block's k step s.
// This lane's B fragments: of C_t for t = g < n (zero past n), the words of each block of 32
// columns (16-byte aligned: the vectorised layouts' rows).
template <int kN>
__device__ __forceinline__ void load_dot_columns(const BFloat16* C, int64_t stride_t, int n,
                                                 uint32_t (&b)[kN / 32][4]) {
  const int lane = threadIdx.x % 32, t = lane / 4, q = lane % 4;
#pragma unroll
  for (int block = 0; block < kN / 32; ++block) {
    const uint4 v = t < n ? *reinterpret_cast<const uint4*>(C + t * stride_t + 32 * block + 8 * q) : uint4{};
    b[block][0] = v.x;
    b[block][1] = v.y;
    b[block][2] = v.z;
    b[block][3] = v.w;
  }
}

// dot(tile row u, t, S_u . C_t) for every row u < tile_rows of a bf16 tile (rows of kN values)
// and t < 8, from load_dot_columns' fragments (zero for t >= n): each warp takes blocks of 16 rows,
// one pair of mma a block of 32 columns. The two rows a lane reads are 8 apart, so a quarter
// warp's 16-byte accesses fall on the banks in pairs (two wavefronts each).
template <int kN, typename Dot>
__device__ __forceinline__ void tile_dots_on_tensor_cores(const BFloat16* tile, int tile_rows,
                                                          const uint32_t (&b)[kN / 32][4], const Dot& dot) {
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  for (int base = threadIdx.x / 32 * 16; base < tile_rows; base += kWarps * 16) {
    const int u0 = base + g, u1 = u0 + 8;
    float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int block = 0; block < kN / 32; ++block) {
      const int column = 32 * block + 8 * q;
      const uint4 lo = u0 < tile_rows ? *reinterpret_cast<const uint4*>(tile + u0 * kN + column) : uint4{};
      const uint4 hi = u1 < tile_rows ? *reinterpret_cast<const uint4*>(tile + u1 * kN + column) : uint4{};
      mma_bf16(d, {lo.x, hi.x, lo.y, hi.y}, b[block][0], b[block][1]);
      mma_bf16(d, {lo.z, hi.z, lo.w, hi.w}, b[block][2], b[block][3]);
    }
    // d: rows u0 (d[0], d[1]) and u1 (d[2], d[3]), columns t = 2 q and 2 q + 1.
    if (u0 < tile_rows) {
      dot(u0, 2 * q, d[0]);
      dot(u0, 2 * q + 1, d[1]);
    }
    if (u1 < tile_rows) {
      dot(u1, 2 * q, d[2]);
      dot(u1, 2 * q + 1, d[3]);
    }
  }
}

// Runs work(row, slot) for this CTA's share of the rows of a batch that selected(row) picks (it
// returns the row's slot, or -1): those whose rank among them, in batch order, is blockIdx.y
// modulo gridDim.y. Every thread takes part. The split paths' flush kernels take their rows so.
template <typename Select, typename Work>
__device__ __forceinline__ void for_each_selected_row(int batch, const Select& selected, const Work& work) {
  constexpr int kWarps = kThreads / 32;
  __shared__ int picked[kWarps], taken[kWarps];  // per warp of the block: selected rows, this CTA's
  __shared__ int taken_rows[kThreads];           // this CTA's rows of the block, in order
  __shared__ int64_t taken_slots[kThreads];
  static_assert(sizeof(picked) + sizeof(taken) + sizeof(taken_rows) + sizeof(taken_slots) == kFlushScanBytes,
                "the host counts this shared memory");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned below = (1u << lane) - 1u;  // the lanes before this one
  int ranked = 0;                            // selected rows before the block
  for (int base = 0; base < batch; base += kThreads) {
    const int row = base + int(threadIdx.x);
    const int64_t slot = row < batch ? selected(row) : -1;
    const bool pick = slot >= 0;
    const unsigned picked_lanes = __ballot_sync(kFullMask, pick);
    if (lane == 0) picked[warp] = __popc(picked_lanes);
    __syncthreads();
    int rank = ranked + __popc(picked_lanes & below);
#pragma unroll
    for (int k = 0; k < kWarps; ++k) {
      if (k < warp) rank += picked[k];
      ranked += picked[k];
    }
    const bool mine = pick && rank % int(gridDim.y) == int(blockIdx.y);
    const unsigned mine_lanes = __ballot_sync(kFullMask, mine);
    if (lane == 0) taken[warp] = __popc(mine_lanes);
    __syncthreads();
    int position = __popc(mine_lanes & below), count = 0;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) {
      if (k < warp) position += taken[k];
      count += taken[k];
    }
    if (mine) {
      taken_rows[position] = row;
      taken_slots[position] = slot;
    }
    __syncthreads();
    for (int m = 0; m < count; ++m) work(taken_rows[m], taken_slots[m]);
    __syncthreads();  // before the next block's counts overwrite these
  }
}

}  // namespace replayssm::cuda
