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
#include <type_traits>

#include "cuda/decode_primitives.cuh"

namespace replayssm::cuda {

// The baseline's CTAs an SM: a 16-bit head's 16 KiB tile leaves room for seven, which keep more
// of the state in flight (bf16, batch 128: 87% -> 89% of copy bandwidth); rows of 256 values need
// the registers of six (they spill under seven's cap).
template <typename S, RowLayoutKind kKind>
constexpr int kBaselineMinCtasPerSm = sizeof(S) == 4 || kKind == RowLayoutKind::kN256 ? kMinCtasPerSm : 7;

// Baseline: S = exp(A dt) S + dt x B^T, y = S C; reads and writes the whole state.
template <typename S, typename Act, RowLayoutKind kKind>
__global__ void __launch_bounds__(kThreads, kBaselineMinCtasPerSm<S, kKind>) state_update_kernel(const Mamba2Params p,
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
  init_tile_barrier<Ly>(barrier);
  // The slot first: the tile's copy waits for it alone, and the CTA's index arithmetic and this
  // step's inputs are issued while it is in flight.
  const int64_t slot = device_slot(p, blockIdx.y);
  const CtaWork w = cta_work(p, rows_per_cta);
  // This step's inputs, kept as stored until the tile's copy is issued (as the replay's).
  const int64_t g = w.group;
  const StoredScalar A = load_head_scalar(p.A, w.head, 0.f);
  const StoredScalar raw_dt =
      load_stored(p.dt, p.dt_dtype, w.row * p.dt_stride_batch + w.head * p.dt_stride_head);
  const StoredScalar bias = load_head_scalar(p.dt_bias, w.head, 0.f);
  const StoredScalar D = load_head_scalar(p.D, w.head, 0.f);
  Pack<Act, Ly::kVec> b_packs[Ly::kVecsPerLane], c_packs[Ly::kVecsPerLane];
  load_slice_packs<Ly>(static_cast<const Act*>(p.B) + w.row * p.B_stride_batch + g * p.B_stride_group, lane, N,
                       b_packs);
  load_slice_packs<Ly>(static_cast<const Act*>(p.C) + w.row * p.C_stride_batch + g * p.C_stride_group, lane, N,
                       c_packs);
  const bool gated = p.z != nullptr;
  const bool has_row = int(threadIdx.x) < w.rows;  // chunk row threadIdx.x (rows_per_cta <= kThreads)
  const int64_t i_mine = w.first + threadIdx.x;
  const Act x_mine = has_row ? load_one(static_cast<const Act*>(p.x) + w.row * p.x_stride_batch +
                                        w.head * p.x_stride_head + i_mine)
                             : Act{};
  const Act z_mine = gated && has_row ? load_one(static_cast<const Act*>(p.z) + w.row * p.z_stride_batch +
                                                 w.head * p.z_stride_head + i_mine)
                                      : Act{};
  if (slot < 0) return;
  S* state = chunk_state<S>(p, w, slot);  // (rows, N)
  start_tile_load<S, Ly>(tile, state, p.state_stride_p, w.rows, N, barrier, L2Hint::kNormal, TileBarrier::kReady);

  const float dt = effective_dt(widen(raw_dt), widen(bias), p.dt_softplus);
  float b[Ly::kVecsPerLane][Ly::kVec], c[Ly::kVecsPerLane][Ly::kVec];
  widen_slice<Ly>(b_packs, b);
  widen_slice<Ly>(c_packs, c);
  if (has_row) {
    x_s[threadIdx.x] = to_float(x_mine);
    if (gated) z_s[threadIdx.x] = to_float(z_mine);
  }
  const float decay = expf(widen(A) * dt);
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
      state_step<Ly>(s, decay, i < w.rows ? dt * x_s[i] : 0.f, b);
      y[k] = slice_dot<Ly>(s, c);
      if (i < w.rows) store_row<S, Ly>(state + i * p.state_stride_p, s, lane, N);
    }
    row_group_sums<Ly::kLanes>(y);
    store_outputs<Ly>(out, y, batch, group, lane, w.rows, widen(D), x_s, gated ? z_s : nullptr);
  }
}

// A flush row's CTA of a dot kernel (fp32 and 16-bit states): folds the window of L tokens (the
// last one this step's) into the checkpoint rows of its heads,
//   S_i = decay S0_i + sum_j weight_j x_j[i] B_j,
// stores them (rounded to nearest) and writes out_i = (S_i . C + D x_i) silu(z_i). The window is
// staged, as stored, past the tile's first part_rows rows (x and z of capacity tile rows; see
// dot_flush_window_bytes: C and B, x and z make L + 1 rows each) while those rows land, ending
// where the tile's bytes end (the split path, as the speculative dot kernel's) or, in the one
// kernel (kOneKernel), where the CTA's shared memory ends (one_kernel_smem may give it more than
// the tile; 16-byte aligned). fold_staged_tile (on the tensor cores where kTensorFold) folds the
// tile part by part. The split path's placement at the tile's end measured 0.5-0.8% faster than at
// the shared memory's end (fp32 state, batch 16-32: notes/cuda.md, v67). The one kernel set up
// the tile's barrier at entry; the split path's dot kernel has not.
// state: the CTA's first checkpoint row (head d.first_head, row d.first of the slot).
template <typename S, typename Act, RowLayoutKind kKind, bool kTensorFold, bool kOneKernel>
__device__ __forceinline__ void flush_heads(const ReplayParams& p, const DotCta& d, int64_t slot, S* state,
                                            int heads, int capacity, int part_rows, unsigned char* smem) {
  using Ly = Layout<S, kKind>;
  static_assert(!CheckpointFormat<S>::kScaled, "8-bit checkpoints keep the flush kernel");
  uint64_t* barrier = reinterpret_cast<uint64_t*>(smem);
  const int N = int(p.state_dim), L = int(p.buffer_len), rows = d.rows, tile_rows = heads * rows;
  const int lane = threadIdx.x % Ly::kLanes, group = threadIdx.x / Ly::kLanes, warp = threadIdx.x / 32;
  S* tile = reinterpret_cast<S*>(smem + kTileOffset);
  const uint32_t window_bytes = uint32_t(dot_flush_window_bytes(heads, capacity, N, L + 1, sizeof(Act)));
  const uint32_t window_end =
      kOneKernel ? dynamic_smem_bytes() : uint32_t(kTileOffset + tile_bytes(capacity, N, sizeof(S)));
  float* weights =
      reinterpret_cast<float*>(smem + ((window_end - window_bytes) & ~15u));  // (heads, kMaxBufferLen)
  float* head_s = weights + heads * kMaxBufferLen;  // (heads, 4): decay, D
  Act* C_s = reinterpret_cast<Act*>(head_s + heads * 4);
  const int n_pitch = int(dot_flush_n_pitch(N, sizeof(Act)));
  Act* B_s = C_s + n_pitch;  // (L, n_pitch)
  Act* x_s = B_s + L * n_pitch;  // (L, x_pitch)
  const int x_pitch = int(dot_flush_x_pitch(capacity, sizeof(Act)));
  Act* z_s = x_s + L * x_pitch;  // (tile rows)

  const int g = d.first_head / int(p.heads_per_group);
  start_heads_tile_load<true>(tile, state, p.state_stride_head, p.state_stride_p, rows, 0, min(part_rows, tile_rows),
                              N, barrier, L2Hint::kEvictFirst, kOneKernel);
  // The window by asynchronous copies of 4 elements: C, B_j (cached, then this step's), x_j and z
  // of the tile rows.
  auto stage = [](Act* dst, const Act* src) { copy_pack_async(reinterpret_cast<Pack<Act, 4>*>(dst), src); };
  const Act* C = static_cast<const Act*>(p.C) + d.row * p.C_stride_batch + g * p.C_stride_group;
  const Act* B_now = static_cast<const Act*>(p.B) + d.row * p.B_stride_batch + g * p.B_stride_group;
  const Act* B_hist = static_cast<const Act*>(p.B_cache) + slot * p.Bc_stride_slot + g * p.Bc_stride_group;
  const int n_pieces = N / 4, x_pieces = rows / 4;
  for (int u = threadIdx.x; u < (L + 1) * n_pieces; u += kThreads) {
    const int j = u / n_pieces, e = (u - j * n_pieces) * 4;  // j = L: C
    const Act* src = j < L - 1 ? B_hist + j * p.Bc_stride_pos : j == L - 1 ? B_now : C;
    stage((j < L ? B_s + j * n_pitch : C_s) + e, src + e);
  }
  for (int u = threadIdx.x; u < (L + 1) * heads * x_pieces; u += kThreads) {
    const int j = u / (heads * x_pieces), r = u - j * heads * x_pieces, k = r / x_pieces;
    const int e = (r - k * x_pieces) * 4, head = d.first_head + k;  // j = L: z
    const Act* src = j < L - 1 ? static_cast<const Act*>(p.x_cache) + slot * p.xc_stride_slot +
                                     head * p.xc_stride_head + j * p.xc_stride_pos
                     : j == L - 1 ? static_cast<const Act*>(p.x) + d.row * p.x_stride_batch + head * p.x_stride_head
                                  : static_cast<const Act*>(p.z) + d.row * p.z_stride_batch + head * p.z_stride_head;
    if (j < L || p.z) stage((j < L ? x_s + j * x_pitch : z_s) + k * rows + e, src + d.first + e);
  }
  for (int k = warp; k < heads; k += kThreads / 32) {
    const int head = d.first_head + k;
    const float* dt_hist = p.dt_cache + slot * p.dtc_stride_slot + head * p.dtc_stride_head;
    // Every value asked for before any is used: one round trip, not one a value.
    const float raw_dt_now = widen(load_stored(p.dt, p.dt_dtype, d.row * p.dt_stride_batch + head * p.dt_stride_head));
    const float bias = head_value(p.dt_bias, head, 0.f), A = head_value(p.A, head, 0.f), D = head_value(p.D, head, 0.f);
    float raw_dt[2], dt[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = threadIdx.x % 32 + 32 * h;
      raw_dt[h] = j < L - 1 ? __ldg(dt_hist + j) : raw_dt_now;
    }
    window_dt(raw_dt, L - 1, bias, p.dt_softplus, dt);
    window_weights(dt, 0, L - 1, A, weights + k * kMaxBufferLen, head_s + 4 * k);
    if (threadIdx.x % 32 == 0) head_s[4 * k + 1] = D;
  }
  wait_async_copies();
  wait_tile_all<Ly>(barrier);

  const StagedFold<Act> fold{weights, head_s, B_s, x_s, n_pitch, x_pitch, L};
  auto write_output = [&](int tile_row, float dot) {  // out_i of the tile row with dot S_i . C
    const int head = tile_row / rows, i = tile_row - head * rows;
    float v = dot + head_s[4 * head + 1] * to_float(x_s[(L - 1) * x_pitch + tile_row]);
    if (p.z) v *= silu(to_float(z_s[tile_row]));
    static_cast<Act*>(p.out)[d.row * p.out_stride_batch + (d.first_head + head) * p.out_stride_head + d.first + i] =
        from_float<Act>(v);
  };
  if constexpr (kTensorFold) {
    static_assert(kTensorCoreFold<S, Act, Ly>, "the tensor cores fold a 4- or 2-byte state with bf16 inputs");
    fold_staged_tile_on_tensor_cores<Ly, 1, true>(
        tile, state, p.state_stride_head, p.state_stride_p, rows, tile_rows, part_rows, N, barrier, fold, 1,
        [&](int, int n) { return to_float(C_s[n]); },
        [&](int tile_row, const float (&dot)[1]) { write_output(tile_row, dot[0]); });
  } else {
    fold_staged_tile<S, Ly, true>(tile, state, p.state_stride_head, p.state_stride_p, rows, tile_rows, part_rows, N,
                                  barrier, fold, [&](const float (&s)[Ly::kRows][Ly::kVecsPerLane][Ly::kVec], int first,
                                                     int next, int batch) {
      float c[Ly::kVecsPerLane][Ly::kVec];
      stored_slice<Ly>(C_s, lane, c);
      float y[Ly::kRows];
#pragma unroll
      for (int q = 0; q < Ly::kRows; ++q) y[q] = slice_dot<Ly>(s[q], c);
      row_group_sums<Ly::kLanes>(y);
      // Lane q < kRows of each row group finishes row q of the batch (as store_outputs).
      const int mine = first + batch * Ly::kBatchRows + lane * Ly::kRowGroups + group;
      if (lane < Ly::kRows && mine < next) write_output(mine, lane_row_sum<Ly>(y, lane));
    });
  }
}

// The window work of a dot CTA's tile rows, done in the CTA itself: the dot kernel as the one
// kernel of a small call (kWindow), where the split path's second launch and its wait for the whole
// dot grid are the step's tail. Thread t < tile rows owns tile row t (its x and z, its history sum
// hist = sum_j weight_j (B_j . C) x_j + D x and its output), the k-th warp from the last weighs head
// k (the last warps' row groups have the window's latest tokens, past most cursors), and row
// group r forms B_j . C of tokens r, r + row groups, .... Every buffer position's history (raw dt,
// B, x) is asked for with the cursor, before the tile's copy, so that the window costs one round
// trip after the slot; positions at and past the cursor are replaced or dropped once it is known.
// The launch gives it one head (one_kernel_dot_shape); a build for one head only, with the head
// count a constant, measured 2-6% slower at batch 3-8 (H100, side by side: notes/cuda.md v40c).
template <typename Act, typename Ly> struct CtaWindow {
  static constexpr int kEarlyRounds = Ly::kRowGroups >= 16 ? 1 : 16 / Ly::kRowGroups;
  static constexpr int kEarlyX = 16;  // cached x positions asked for with the cursor
  using Slice = Pack<Act, Ly::kVec>;

  DotCta d;
  int heads, group;
  bool has_row;
  int k, i;  // this thread's tile row: head first_head + k, head_dim row i
  int weighed;  // the head this thread's warp weighs (where < heads)
  Act x_now, z_now;
  StoredScalar D;                                // of head k
  StoredScalar raw_now, A, bias;                 // of head `weighed`
  Slice b_now[Ly::kVecsPerLane];                 // this step's B
  float raw_dt[2];                               // cached raw dt of tokens lane and lane + 32
  Slice b_early[kEarlyRounds][Ly::kVecsPerLane];  // cached B of tokens r row groups + this row group
  Act x_early[kEarlyX];
  float* weights;  // (heads, kMaxBufferLen)
  float* decay;    // (heads)
  float* bc;       // (kMaxBufferLen): B_j . C
  float hist, gate;

  // This step's inputs: they need no slot, and are asked for while it is in flight.
  __device__ __forceinline__ CtaWindow(const ReplayParams& p, const DotCta& cta, int heads_per_cta, float* shared)
      : d(cta), heads(heads_per_cta), group(cta.first_head / int(p.heads_per_group)) {
    weights = shared;
    decay = weights + heads * kMaxBufferLen;
    bc = decay + heads;
    k = int(threadIdx.x) / d.rows;
    i = d.first + int(threadIdx.x) - k * d.rows;
    has_row = k < heads;
    weighed = kThreads / 32 - 1 - int(threadIdx.x) / 32;
    const int h = d.first_head + (has_row ? k : 0), hw = d.first_head + min(weighed, heads - 1);
    x_now = z_now = Act{};
    if (has_row) {
      x_now = load_one(static_cast<const Act*>(p.x) + d.row * p.x_stride_batch + h * p.x_stride_head + i);
      if (p.z) z_now = load_one(static_cast<const Act*>(p.z) + d.row * p.z_stride_batch + h * p.z_stride_head + i);
    }
    D = load_head_scalar(p.D, h, 0.f);
    raw_now = load_stored(p.dt, p.dt_dtype, d.row * p.dt_stride_batch + hw * p.dt_stride_head);
    A = load_head_scalar(p.A, hw, 0.f);
    bias = load_head_scalar(p.dt_bias, hw, 0.f);
    load_slice_packs<Ly>(B_now(p), int(threadIdx.x) % Ly::kLanes, p.state_dim, b_now);
  }

  __device__ __forceinline__ const Act* B_now(const ReplayParams& p) const {
    return static_cast<const Act*>(p.B) + d.row * p.B_stride_batch + group * p.B_stride_group;
  }
  __device__ __forceinline__ Act* B_hist(const ReplayParams& p, int64_t slot) const {  // (L, N)
    return static_cast<Act*>(p.B_cache) + slot * p.Bc_stride_slot + group * p.Bc_stride_group;
  }
  __device__ __forceinline__ Act* x_hist(const ReplayParams& p, int64_t slot) const {  // (L) of this row
    return static_cast<Act*>(p.x_cache) + slot * p.xc_stride_slot + (d.first_head + k) * p.xc_stride_head + i;
  }
  __device__ __forceinline__ float* dt_hist(const ReplayParams& p, int64_t slot) const {  // (L) of head `weighed`
    return p.dt_cache + slot * p.dtc_stride_slot + (d.first_head + weighed) * p.dtc_stride_head;
  }

  // Every cached position but the last (whose token would be this step's), before the cursor is known.
  __device__ __forceinline__ void load_history(const ReplayParams& p, int64_t slot) {
    const int cached = int(p.buffer_len) - 1, lane = int(threadIdx.x) % Ly::kLanes;
    const int row_group = int(threadIdx.x) / Ly::kLanes;
    raw_dt[0] = raw_dt[1] = 0.f;
    if (weighed < heads) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = int(threadIdx.x) % 32 + 32 * half;
        if (j < cached) raw_dt[half] = __ldg(dt_hist(p, slot) + j);
      }
    }
#pragma unroll
    for (int r = 0; r < kEarlyRounds; ++r) {
      const int j = r * Ly::kRowGroups + row_group;
      if (j < cached) load_slice_packs<Ly>(B_hist(p, slot) + j * p.Bc_stride_pos, lane, p.state_dim, b_early[r]);
    }
    if (has_row) {
      const Act* x = x_hist(p, slot);
#pragma unroll
      for (int u = 0; u < kEarlyX; ++u)
        if (u < cached) x_early[u] = load_one(x + u * p.xc_stride_pos);
    }
  }

  // The window of a non-flush row (cursor < L - 1): weights and decay, B_j . C, then (one CTA
  // barrier) this thread's history sum and gate; this step's raw dt, B and x appended at the
  // cursor (the raw dt and B by the CTAs of the head's, and the group's, first rows).
  __device__ __forceinline__ void form(const ReplayParams& p, int64_t slot, int cursor,
                                       const float (&c)[Ly::kVecsPerLane][Ly::kVec]) {
    const int count = cursor + 1, lane = int(threadIdx.x) % Ly::kLanes, row_group = int(threadIdx.x) / Ly::kLanes;
    if (weighed < heads) {
      const int lane32 = int(threadIdx.x) % 32;
#pragma unroll
      for (int half = 0; half < 2; ++half)
        if (lane32 + 32 * half == cursor) raw_dt[half] = widen(raw_now);
      float dt[2];
      window_dt(raw_dt, cursor, widen(bias), p.dt_softplus, dt);
      float* w = weights + weighed * kMaxBufferLen;
      if (count <= 16)  // a shorter scan, the same sums
        window_weights_short<16>(dt[0], 0, count, widen(A), lane32 < 16 ? w : nullptr,
                                 lane32 < 16 ? decay + weighed : nullptr);
      else
        window_weights(dt, 0, cursor, widen(A), w, decay + weighed);
      if (lane32 == 0 && d.first == 0) dt_hist(p, slot)[cursor] = widen(raw_now);
    }
    float sums[kEarlyRounds];
#pragma unroll
    for (int r = 0; r < kEarlyRounds; ++r) {
      const int j = r * Ly::kRowGroups + row_group;
      sums[r] = 0.f;
      if (j <= cursor) {
        Slice packs[Ly::kVecsPerLane];
        float b[Ly::kVecsPerLane][Ly::kVec];
#pragma unroll
        for (int v = 0; v < Ly::kVecsPerLane; ++v) packs[v] = j == cursor ? b_now[v] : b_early[r][v];
        widen_slice<Ly>(packs, b);
        sums[r] = slice_dot<Ly>(b, c);
      }
    }
    row_group_sums<Ly::kLanes>(sums);
#pragma unroll
    for (int r = 0; r < kEarlyRounds; ++r) {
      const int j = r * Ly::kRowGroups + row_group;
      if (lane == 0 && j <= cursor) bc[j] = sums[r];
    }
    for (int j0 = kEarlyRounds * Ly::kRowGroups; j0 < count; j0 += Ly::kRowGroups) {  // longer windows
      const int j = j0 + row_group;
      float later[1] = {0.f};
      if (j < count) {
        float b[Ly::kVecsPerLane][Ly::kVec];
        load_slice<Ly>(j < cursor ? B_hist(p, slot) + j * p.Bc_stride_pos : B_now(p), lane, p.state_dim, b);
        later[0] = slice_dot<Ly>(b, c);
      }
      row_group_sums<Ly::kLanes>(later);
      if (lane == 0 && j < count) bc[j] = later[0];
    }
    if (row_group == 0 && d.first == 0 && d.first_head == group * int(p.heads_per_group)) {
      Act* B_at_cursor = B_hist(p, slot) + cursor * p.Bc_stride_pos;
#pragma unroll
      for (int v = 0; v < Ly::kVecsPerLane; ++v) store_pack(B_at_cursor + first_element<Ly>(v, lane), b_now[v]);
    }
    __syncthreads();
    hist = 0.f;
    gate = 1.f;
    if (has_row) {
      const float* w = weights + k * kMaxBufferLen;
      Act* x = x_hist(p, slot);
#pragma unroll
      for (int u = 0; u < kEarlyX; ++u)
        if (u < cursor) hist = fmaf(w[u] * bc[u], to_float(x_early[u]), hist);
      for (int j = kEarlyX; j < cursor; ++j)
        hist = fmaf(w[j] * bc[j], to_float(load_one(x + j * p.xc_stride_pos)), hist);
      const float now = to_float(x_now);
      hist = fmaf(widen(D), now, fmaf(w[cursor] * bc[cursor], now, hist));
      if (p.z) gate = silu(to_float(z_now));
      x[cursor * p.xc_stride_pos] = x_now;
    }
  }

  // out = (decay dot + hist) silu(z) of this thread's tile row, from its checkpoint dot.
  __device__ __forceinline__ void write_output(const ReplayParams& p, const float* dots) const {
    if (!has_row) return;
    static_cast<Act*>(p.out)[d.row * p.out_stride_batch + (d.first_head + k) * p.out_stride_head + i] =
        from_float<Act>(fmaf(decay[k], dots[threadIdx.x], hist) * gate);
  }
};

// The dot kernel's window where it has none (the split path).
struct NoCtaWindow {
  __device__ __forceinline__ NoCtaWindow(const ReplayParams&, const DotCta&, int, float*) {}
};

// The split path's first kernel (a workspace was given, vectorised layouts): the checkpoint dots
//   dot_i = scale_i (S0_i . C)
// of `rows` head_dim rows from `first` of heads_per_cta heads of one group per CTA, every row of
// every head, into the workspace (batch, H, P). Flush rows fold their window into their
// checkpoints instead (flush_heads, where part_rows > 0). A non-flush CTA reads its slot, its cursor, C
// and its tile and nothing else, so that its life is one copy of its tile: a lean read of the
// checkpoint. Corrupt cursors are skipped (the window kernel skips them too).
// kWindow: the one kernel of a small call (no workspace; 2- and 4-byte states, output-only route,
// at most kThreads tile rows and kThreads / 32 heads a CTA, part_rows > 0): each non-flush
// CTA also does its rows' window work (CtaWindow) and writes their outputs.
template <typename S, typename Act, RowLayoutKind kKind, bool kTensorFold, bool kWindow>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm) checkpoint_dot_kernel(const ReplayParams p,
                                                                 int heads_per_cta, int rows, int part_rows) {
  using Ly = Layout<S, kKind>;
  static_assert(!kWindow || !CheckpointFormat<S>::kScaled, "8-bit checkpoints keep the split path's flush kernel");
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* barrier = reinterpret_cast<uint64_t*>(smem);
  if constexpr (kWindow)
    init_tile_barrier<Ly>(barrier);  // before the window's loads are in flight (init_tile_barrier)
  else
    allow_dependent_launch();  // the window kernel's CTAs may start with this kernel's last wave
  const int N = int(p.state_dim), P = int(p.head_dim);
  const int tile_rows = heads_per_cta * rows;
  S* tile = reinterpret_cast<S*>(smem + kTileOffset);  // (heads, rows, N)
  float* row_s = reinterpret_cast<float*>(smem + kTileOffset + tile_bytes(tile_rows, N, sizeof(S)));  // (tile rows)
  const int lane = threadIdx.x % Ly::kLanes, group = threadIdx.x / Ly::kLanes;
  const int64_t slot = device_slot(p, blockIdx.y);  // first: the CTA's chain starts with it
  const DotCta d = dot_cta(P, heads_per_cta, rows);
  const int row = d.row, first_head = d.first_head, first = d.first;
  rows = d.rows;
  // C, as stored, while the slot and the cursor come in: the window's B_j . C wait for it.
  Pack<Act, Ly::kVec> c_packs[Ly::kVecsPerLane];
  load_slice_packs<Ly>(static_cast<const Act*>(p.C) + row * p.C_stride_batch +
                           first_head / int(p.heads_per_group) * p.C_stride_group,
                       lane, N, c_packs);
  std::conditional_t<kWindow, CtaWindow<Act, Ly>, NoCtaWindow> window(p, d, heads_per_cta, row_s + tile_rows);
  if (slot < 0) return;
  const int cursor = load_one(p.cursors + slot * p.cursors_stride);
  if constexpr (kWindow) window.load_history(p, slot);
  if (cursor < 0 || cursor >= int(p.buffer_len)) return;
  S* state = static_cast<S*>(p.state) + slot * p.state_stride_slot + first_head * p.state_stride_head +
             first * p.state_stride_p;
  if (cursor == int(p.buffer_len) - 1) {  // part_rows 0: the flush kernel's (always for 8-bit checkpoints)
    if constexpr (!CheckpointFormat<S>::kScaled)
      if (part_rows > 0)
        flush_heads<S, Act, kKind, kTensorFold, kWindow>(p, d, slot, state, heads_per_cta, tile_rows, part_rows,
                                                         smem);
    return;
  }
  start_heads_tile_load<true>(tile, state, p.state_stride_head, p.state_stride_p, rows, 0, heads_per_cta * rows, N,
                              barrier, L2Hint::kEvictFirst, kWindow);
  float c[Ly::kVecsPerLane][Ly::kVec];
  widen_slice<Ly>(c_packs, c);
  if constexpr (CheckpointFormat<S>::kScaled) {
    for (int t = threadIdx.x; t < heads_per_cta * rows; t += kThreads) {
      const int k = t / rows;
      row_s[t] = p.state_scale[slot * p.scale_stride_slot + (first_head + k) * p.scale_stride_head +
                               first + t - k * rows];
    }
  }
  if constexpr (kWindow) window.form(p, slot, cursor, c);
  wait_tile_all<Ly>(barrier);

  const int batches = (rows + Ly::kBatchRows - 1) / Ly::kBatchRows;
  for (int k = 0; k < heads_per_cta; ++k) {
    float* dots = kWindow ? row_s + k * rows
                          : p.workspace + (int64_t(row) * p.nheads + first_head + k) * P + first;  // (rows)
    for (int batch = 0; batch < batches; ++batch) {
      float y[Ly::kRows];
#pragma unroll
      for (int r = 0; r < Ly::kRows; ++r) {
        float s[Ly::kVecsPerLane][Ly::kVec];
        tile_row<S, Ly>(tile + k * rows * N, chunk_row<Ly>(batch, r, group), rows, lane, N, s);
        y[r] = slice_dot<Ly>(s, c);
      }
      row_group_sums<Ly::kLanes>(y);
      const int i = batch * Ly::kBatchRows + lane * Ly::kRowGroups + group;
      if (lane < Ly::kRows && i < rows)
        dots[i] = CheckpointFormat<S>::kScaled ? row_s[k * rows + i] * lane_row_sum<Ly>(y, lane)
                                               : lane_row_sum<Ly>(y, lane);
    }
  }
  if constexpr (kWindow) {
    __syncthreads();  // every row's dot
    window.write_output(p, row_s);
  }
}

// The split path's second kernel, launched as the dot kernel's programmatic dependent: the window
// work and the outputs of the non-flush rows, once per (batch row, up to heads_per_cta heads of
// one group) rather than in every CTA of a decode kernel. Thread t takes kRows consecutive
// head_dim rows of one head, so that its x, z, cached x, dots and outputs move in packs. Before
// it waits for the dot kernel it appends this step's x, B and raw dt at the cursor and forms, per
// head, the checkpoint decay and each head_dim row's history sum
//   hist_i = sum_j weight_j (B_j . C) x_j[i] + D x_i;
// then out_i = (decay dot_i + hist_i) silu(z_i). Pad rows and corrupt cursors are skipped, flush
// rows are left to the dot or the flush kernel. Every CTA waits for the dot kernel before it
// exits, so that this kernel's completion implies that one's. Its registers are capped at 64 (two
// CTAs of kWindowThreads an SM): eight 128-thread CTAs an SM take a batch of 128 rows in one wave.
// kOneRound (a grid of few CTAs an SM, window_one_round): the window's cached x and B come by
// asynchronous copies into shared memory, kWindowOneRoundTokens tokens a round, all asked for
// once the cursor is known; otherwise each thread stages kWindowStagedBytes of its x a round and
// each warp loads B two tokens at a time, what eight CTAs an SM run faster (notes/cuda.md, v69).
template <typename Act, int kRows, bool kOneRound>
__global__ void __launch_bounds__(kWindowThreads, 2) replay_window_kernel(const ReplayParams p, int heads_per_cta) {
  __shared__ float coef[kMaxWindowHeads][kMaxBufferLen];  // each head's weights, then weight_j (B_j . C)
  __shared__ float decay[kMaxWindowHeads], D_s[kMaxWindowHeads], A_s[kMaxWindowHeads],
      bias_s[kMaxWindowHeads], raw_now_s[kMaxWindowHeads];
  __shared__ float bc[kMaxBufferLen];  // B_j . C
  // Each thread's staged cached x, then (kOneRound) a round of the window's B: window_smem_bytes.
  extern __shared__ __align__(16) unsigned char window_smem[];
  allow_dependent_launch();  // the flush kernel may start its loads now
  using Rows = Pack<Act, kRows>;
  const int warps = int(blockDim.x) / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int hpg = int(p.heads_per_group), P = int(p.head_dim), N = int(p.state_dim);
  const int L = int(p.buffer_len);
  const int chunks = (hpg + heads_per_cta - 1) / heads_per_cta;
  const int group = int(blockIdx.x) / chunks;
  const int first_head = group * hpg + (int(blockIdx.x) % chunks) * heads_per_cta;
  const int heads = min(heads_per_cta, (group + 1) * hpg - first_head);
  const int row = int(blockIdx.y);
  // First what this batch row's inputs give (its x, z and C, the heads' scalars and raw dt), in
  // flight while the slot, then the cursor, come in.
  const int per_head = P / kRows;  // this thread's rows: head k, rows [i, i + kRows)
  const int k = int(threadIdx.x) / per_head, i = (int(threadIdx.x) - k * per_head) * kRows;
  const bool has_rows = k < heads;
  const int h = first_head + k;
  Rows x_now{}, z_now{};
  if (has_rows) {
    x_now = load_pack<Act, kRows>(static_cast<const Act*>(p.x) + row * p.x_stride_batch + h * p.x_stride_head + i);
    if (p.z)
      z_now = load_pack<Act, kRows>(static_cast<const Act*>(p.z) + row * p.z_stride_batch + h * p.z_stride_head + i);
  }
  const bool head_thread = int(threadIdx.x) < heads;  // one head a thread
  const int hq = first_head + int(threadIdx.x);
  float raw_now = 0.f, A = 0.f, bias = 0.f, D = 0.f;
  if (head_thread) {
    raw_now = widen(load_stored(p.dt, p.dt_dtype, row * p.dt_stride_batch + hq * p.dt_stride_head));
    A = head_value(p.A, hq, 0.f);
    bias = head_value(p.dt_bias, hq, 0.f);
    D = head_value(p.D, hq, 0.f);
  }
  // B_j . C is formed by warps, lane l taking the pieces of kPiece elements from n = kPiece
  // (l + 32 v): B, C and the B cache are aligned to them on the split path (slice_access_bytes).
  constexpr int kPiece = 4, kPieces = kMaxStateDim / (32 * kPiece);
  using Piece = Pack<Act, kPiece>;
  auto has_piece = [&](int v) { return kPiece * (lane + 32 * v) < N; };
  const Act* C_now = static_cast<const Act*>(p.C) + row * p.C_stride_batch + group * p.C_stride_group;
  float c[kPieces][kPiece];
#pragma unroll
  for (int v = 0; v < kPieces; ++v) {
    const Piece q = has_piece(v) ? load_pack<Act, kPiece>(C_now + kPiece * (lane + 32 * v)) : Piece{};
    widen_pack(q, c[v]);
  }
  // sum + (piece v of B_j) . (piece v of C)
  auto add_piece_dot = [&](const Piece& b_v, int v, float sum) {
    float b[kPiece];
    widen_pack(b_v, b);
#pragma unroll
    for (int e = 0; e < kPiece; ++e) sum = fmaf(b[e], c[v][e], sum);
    return sum;
  };

  const int64_t slot = device_slot(p, row);
  if (slot < 0) return wait_for_prior_kernel();
  // Warp w forms the window weights and decay of heads w, w + warps, ... (the host gives every
  // warp at most kWindowHeadsPerWarp heads); their cached raw dt is loaded before the cursor is
  // known (tokens past it are replaced or dropped there). Windows of up to 16 tokens (L <= 17) take
  // two heads a pass, lanes 16 s + t taking token t of the pass's head s (window_weights_short);
  // longer ones one head a pass, lanes l taking tokens l and l + 32 (window_weights).
  const bool short_window = L <= 17;
  auto pass_head = [&](int q) { return short_window ? warp + warps * (2 * q + lane / 16) : warp + warps * q; };
  auto pass_token = [&](int half) { return short_window ? lane % 16 : lane + 32 * half; };
  float raw_dt[kWindowHeadsPerWarp][2];
#pragma unroll
  for (int q = 0; q < kWindowHeadsPerWarp; ++q) {
    const int kq = pass_head(q);
    const float* dt_hist = p.dt_cache + slot * p.dtc_stride_slot + (first_head + kq) * p.dtc_stride_head;  // (L)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int j = pass_token(half);
      raw_dt[q][half] = kq < heads && j < L - 1 && (half == 0 || !short_window) ? __ldg(dt_hist + j) : 0.f;
    }
  }
  const int cursor = load_one(p.cursors + slot * p.cursors_stride);
  if (cursor < 0 || cursor >= L - 1) return wait_for_prior_kernel();
  const int count = cursor + 1;

  // The first tokens of this thread's cached x, copied into shared memory (no registers held), and
  // with kOneRound, in a group of copies before them, the first tokens of the group's B (this step's
  // at the cursor).
  Act* x_hist = static_cast<Act*>(p.x_cache) + slot * p.xc_stride_slot + h * p.xc_stride_head + i;
  constexpr int kStaged = kOneRound ? kWindowOneRoundTokens : kWindowStagedBytes / int(sizeof(Rows));  // a round
  // A round's tokens: all kStaged, each under a test, in a few rounds' loops (fully unrolled); only
  // those before the cursor in one round's (a fully unrolled one of kWindowOneRoundTokens tests was
  // 2-5% slower at L = 16, batch 16-32).
  constexpr int kUnroll = kOneRound ? 4 : kStaged;
  auto round_tokens = [&](int first) { return kOneRound ? min(kStaged, cursor - first) : kStaged; };
  Rows* x_staged = reinterpret_cast<Rows*>(window_smem) + threadIdx.x;  // round token u: [u * blockDim.x]
  auto stage_x = [&](int first) {
#pragma unroll kUnroll
    for (int u = 0; u < round_tokens(first); ++u)
      if (first + u < cursor) copy_pack_async(x_staged + u * blockDim.x, x_hist + (first + u) * p.xc_stride_pos);
  };
  const Act* B_now = static_cast<const Act*>(p.B) + row * p.B_stride_batch + group * p.B_stride_group;
  Act* B_hist = static_cast<Act*>(p.B_cache) + slot * p.Bc_stride_slot + group * p.Bc_stride_group;  // (L, N)
  const int pieces = N / kPiece;
  // (kOneRound) round tokens x pieces, past every thread's staged x (window_smem_bytes)
  Piece* B_staged = reinterpret_cast<Piece*>(window_smem + blockDim.x * window_round_tokens(L - 1) * sizeof(Rows));
  auto stage_B = [&](int first) {
    const int tokens = min(count - first, kStaged);
    for (int e = threadIdx.x; e < tokens * pieces; e += blockDim.x) {
      const int u = e / pieces, j = first + u;
      copy_pack_async(B_staged + e, (j < cursor ? B_hist + j * p.Bc_stride_pos : B_now) + kPiece * (e - u * pieces));
    }
  };
  if constexpr (kOneRound) {
    stage_B(0);
    close_async_group();
  }
  if (has_rows) stage_x(0);
  // Closed too, so that waiting for all groups but the last waits for B's: copies in no closed
  // group are not waited for by a group wait.
  if constexpr (kOneRound) close_async_group();
  if (head_thread) {  // the head's scalars for the CTA; its raw dt appended
    raw_now_s[threadIdx.x] = raw_now;
    A_s[threadIdx.x] = A;
    bias_s[threadIdx.x] = bias;
    D_s[threadIdx.x] = D;
    p.dt_cache[slot * p.dtc_stride_slot + hq * p.dtc_stride_head + cursor] = raw_now;
  }
  __syncthreads();  // the heads' scalars
#pragma unroll
  for (int q = 0; q < kWindowHeadsPerWarp; ++q) {
    if (warp + warps * (short_window ? 2 * q : q) >= heads) break;  // no head in this pass (warp-uniform)
    const int kq = pass_head(q);
    const bool has_head = kq < heads;  // false only in a short pass's second segment
    const int k_s = has_head ? kq : 0;
#pragma unroll
    for (int half = 0; half < 2; ++half)
      if (pass_token(half) == cursor) raw_dt[q][half] = raw_now_s[k_s];
    if (short_window) {  // one token a lane
      window_weights_short<16>(lane % 16 <= cursor ? effective_dt(raw_dt[q][0], bias_s[k_s], p.dt_softplus) : 0.f, 0,
                               count, A_s[k_s], has_head ? coef[kq] : nullptr, has_head ? &decay[kq] : nullptr);
    } else {
      float dt[2];
      window_dt(raw_dt[q], cursor, bias_s[kq], p.dt_softplus, dt);
      window_weights(dt, 0, cursor, A_s[kq], coef[kq], &decay[kq]);
    }
  }
  // B_j . C for every token of the window, one warp per token (this step's B for the cursor's).
  if constexpr (kOneRound) {
    int first = 0;
    for (;; first += kStaged) {
      if (first == 0) wait_async_groups_but_last();  // not the cached x
      else wait_async_copies();
      __syncthreads();  // the round's B has landed
      for (int j = first + warp; j < min(count, first + kStaged); j += warps) {
        float sum[1] = {0.f};
#pragma unroll
        for (int v = 0; v < kPieces; ++v)
          if (has_piece(v)) sum[0] = add_piece_dot(B_staged[(j - first) * pieces + lane + 32 * v], v, sum[0]);
        row_group_sums<32>(sum);
        if (lane == 0) bc[j] = sum[0];
      }
      if (first + kStaged >= count) break;
      __syncthreads();  // the round's B is read
      stage_B(first + kStaged);
    }
    if (first_head == group * hpg) {  // the group's first head appends B (the last round's, at the cursor)
      for (int v = threadIdx.x; v < pieces; v += blockDim.x)
        store_pack(B_hist + cursor * p.Bc_stride_pos + kPiece * v, B_staged[(cursor - first) * pieces + v]);
    }
    __syncthreads();
  } else {
    for (int j0 = warp; j0 < count; j0 += 2 * warps) {  // two tokens' loads in flight
      Piece b[2][kPieces];
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const int j = j0 + t * warps;
        const Act* B_j = j < cursor ? B_hist + j * p.Bc_stride_pos : B_now;
#pragma unroll
        for (int v = 0; v < kPieces; ++v)
          b[t][v] = j < count && has_piece(v) ? load_pack<Act, kPiece>(B_j + kPiece * (lane + 32 * v)) : Piece{};
      }
      float sum[2] = {0.f, 0.f};
#pragma unroll
      for (int t = 0; t < 2; ++t) {
#pragma unroll
        for (int v = 0; v < kPieces; ++v) sum[t] = add_piece_dot(b[t][v], v, sum[t]);
      }
      row_group_sums<32>(sum);
#pragma unroll
      for (int t = 0; t < 2; ++t)
        if (lane == 0 && j0 + t * warps < count) bc[j0 + t * warps] = sum[t];
    }
    if (first_head == group * hpg) {  // the group's first head appends B
      for (int n = threadIdx.x; n < N; n += blockDim.x) B_hist[cursor * p.Bc_stride_pos + n] = B_now[n];
    }
    __syncthreads();
  }
  // The history coefficients weight_j (B_j . C), in place of the weights.
  for (int e = threadIdx.x; e < heads * count; e += blockDim.x) {
    const int kq = e / count, j = e - kq * count;
    coef[kq][j] *= bc[j];
  }
  __syncthreads();

  // The history sums (tokens in order, then this step's and D x) and gates.
  float hist[kRows], gate[kRows];
  if (has_rows) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) hist[r] = 0.f;
    auto add = [&](int j, const Rows& x_j) {
      const float a = coef[k][j];
      float xf[kRows];
      widen_pack(x_j, xf);
#pragma unroll
      for (int r = 0; r < kRows; ++r) hist[r] = fmaf(a, xf[r], hist[r]);
    };
    for (int first = 0; first < cursor; first += kStaged) {
      if (first > 0) stage_x(first);  // a longer window: the next round of this thread's tokens
      wait_async_copies();
#pragma unroll kUnroll
      for (int u = 0; u < round_tokens(first); ++u)
        if (first + u < cursor) add(first + u, x_staged[u * blockDim.x]);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float now = to_float(x_now.v[r]);
      hist[r] = fmaf(D_s[k], now, fmaf(coef[k][cursor], now, hist[r]));
      gate[r] = p.z ? silu(to_float(z_now.v[r])) : 1.f;
    }
    store_pack(x_hist + cursor * p.xc_stride_pos, x_now);
  }

  // The outputs, from the dot kernel's checkpoint dots.
  wait_for_prior_kernel();
  if (has_rows) {
    const float* dots = p.workspace + (int64_t(row) * p.nheads + h) * P + i;
    Rows out;
#pragma unroll
    for (int r = 0; r < kRows; r += 4) {
      float dot[4];
      load_piece(dots + r, dot);
#pragma unroll
      for (int e = 0; e < 4; ++e) out.v[r + e] = from_float<Act>(fmaf(decay[k], dot[e], hist[r + e]) * gate[r + e]);
    }
    store_pack(static_cast<Act*>(p.out) + row * p.out_stride_batch + h * p.out_stride_head + i, out);
  }
}

// ReplaySSM standard decode of one CTA's (row, head, chunk). The window is the cached history
// (positions 0 .. cursor-1) plus this step's token at position `cursor`. Flush rows
// (cursor == L-1) and the state-and-output route form S = decay S0 + sum_j weight_j x_j B_j^T row
// by row (flush rows store it); the output-only route computes
// y = decay (S0 C) + sum_j weight_j (B_j . C) x_j without forming S. Non-flush rows append x, B
// (first head of the group) and the raw dt at position `cursor`. kStochastic (the call's
// stochastic_rounding) is a separate instantiation: the Philox rounds, compiled into the flush
// rows, cost registers that make the row loop spill under the register cap. kFlushOnly: the split
// path's flush kernel (flush rows only, B staged in shared memory). tile_phase: of the CTA's tile
// barrier, the phase this row's tile completes (the flush kernel's CTAs take one row after another).
template <typename S, typename Act, RowLayoutKind kKind, bool kStochastic, bool kFlushOnly,
          typename SlotOf, typename CursorOf>
__device__ __forceinline__ void replay_rows(const ReplayParams& p, const CtaWork& w, const SlotOf& slot_of,
                                            const CursorOf& cursor_of, int rows_per_cta,
                                            bool output_only, unsigned char* smem, unsigned tile_phase = 0) {
  using Ly = Layout<S, kKind>;
  uint64_t* barrier = reinterpret_cast<uint64_t*>(smem);
  const int64_t N = p.state_dim;
  S* tile = reinterpret_cast<S*>(smem + kTileOffset);  // (rows, N)
  float* window = reinterpret_cast<float*>(
      smem + kTileOffset + tile_bytes(rows_per_cta, row_elements<Ly>(N), sizeof(S)));
  float* z_s = window + kWindowZOffset;     // (rows)
  float* scale_s = z_s + rows_per_cta;      // (rows): an 8-bit checkpoint's row scales
  float* x_s = scale_s + rows_per_cta;      // (count, pitch)
  const int pitch = int(window_pitch(rows_per_cta, Ly::kLanes));
  float* B_s = x_s + (p.buffer_len * pitch + 3) / 4 * 4;  // (count, N), kFlushOnly; 16-byte aligned
  const int lane = threadIdx.x % Ly::kLanes, group = threadIdx.x / Ly::kLanes;
  const int64_t g = w.group;
  const int L = int(p.buffer_len);
  // Thread t stages the window's x of chunk row i_x for tokens j_x, j_x + x_step, ...
  const int x_step = kThreads / rows_per_cta;
  const int i_x = threadIdx.x % rows_per_cta, j_x = threadIdx.x / rows_per_cta;
  const bool stages_x = i_x < w.rows && j_x < x_step;
  constexpr int kEarlyRounds = Ly::kRowGroups >= 16 ? 1 : 16 / Ly::kRowGroups, kEarlyX = 8;
  constexpr bool kSpeculative = kEarlyRounds * Ly::kVecsPerLane * sizeof(Pack<Act, Ly::kVec>) <= 32;
  // The rows that may use the early B: output-only ones (B_j . C) and kFlushOnly's (staged B).
  const bool may_use_B = output_only || kFlushOnly;
  // This step's inputs need neither the slot nor the cursor: asked for while the slot is in flight
  // (the single kernel asks for it at entry), kept as stored until the tile's copy is issued, so
  // that they do not queue behind it (the window's weights and B_j . C wait for them; notes/cuda.md
  // v21, v29).
  const StoredScalar A_stored = load_head_scalar(p.A, w.head, 0.f);
  const StoredScalar bias_stored = load_head_scalar(p.dt_bias, w.head, 0.f);
  const StoredScalar D_stored = load_head_scalar(p.D, w.head, 0.f);
  const StoredScalar raw_dt_stored =
      load_stored(p.dt, p.dt_dtype, w.row * p.dt_stride_batch + w.head * p.dt_stride_head);
  const Act* B_now = static_cast<const Act*>(p.B) + w.row * p.B_stride_batch +
                     g * p.B_stride_group;  // (N)
  Pack<Act, Ly::kVec> c_packs[Ly::kVecsPerLane];
  load_slice_packs<Ly>(static_cast<const Act*>(p.C) + w.row * p.C_stride_batch + g * p.C_stride_group, lane, N,
                       c_packs);
  const Act* x_now = static_cast<const Act*>(p.x) + w.row * p.x_stride_batch +
                     w.head * p.x_stride_head + w.first;  // (rows)
  Pack<Act, Ly::kVec> b_now[Ly::kVecsPerLane];  // kSpeculative: this step's B and x, for the cursor
  if (kSpeculative && may_use_B) load_slice_packs<Ly>(B_now, lane, N, b_now);
  const Act x_now_mine = kSpeculative && stages_x ? load_one(x_now + i_x) : Act{};
  const bool gated = p.z != nullptr;
  const Act z_mine =  // z of chunk row threadIdx.x (rows_per_cta <= kThreads)
      gated && int(threadIdx.x) < w.rows
          ? load_one(static_cast<const Act*>(p.z) + w.row * p.z_stride_batch + w.head * p.z_stride_head + w.first +
                     threadIdx.x)
          : Act{};
  // The first head of a group appends B: elements threadIdx.x and threadIdx.x + kThreads.
  const bool appends_B = w.chunk == 0 && w.head == w.group * int(p.heads_per_group);
  Act B_mine[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int n = threadIdx.x + h * kThreads;
    if (appends_B && n < N) B_mine[h] = load_one(B_now + n);
  }

  const int64_t slot = slot_of();
  if (slot < 0) return;
  S* state = chunk_state<S>(p, w, slot);  // (rows, N)
  const int cursor = cursor_of(slot);  // issued ahead of the tile's copy (see kSpeculative)
  Act* x_hist = static_cast<Act*>(p.x_cache) + slot * p.xc_stride_slot +
                w.head * p.xc_stride_head + w.first;  // (L, rows), position stride xc_stride_pos
  Act* B_hist = static_cast<Act*>(p.B_cache) + slot * p.Bc_stride_slot +
                g * p.Bc_stride_group;  // (L, N), position stride Bc_stride_pos
  float* dt_hist = p.dt_cache + slot * p.dtc_stride_slot + w.head * p.dtc_stride_head;  // (L)
  // The window's first loads (raw dt, B_j of the first tokens of each row group, the first x values
  // of each thread) are all issued before any is used: one memory round trip for windows up to
  // kEarlyRounds * row_groups tokens and kEarlyX * x_step tokens of x (L = 16 with whole heads of
  // 64); the loops after the cursor finish longer windows. kSpeculative: the history of every
  // position of the buffer is asked for before the cursor is known, ahead of the tile's copy
  // (behind it, these loads and the cursor's wait for much of the copy; notes/cuda.md v20); this
  // step's B is then held for the row group of the cursor, so only where a lane's B slices take at
  // most 32 bytes (more spill under the register cap).
  float raw_dt[2] = {0.f, 0.f};
  Pack<Act, Ly::kVec> b_early[kEarlyRounds][Ly::kVecsPerLane];
  Act x_early[kEarlyX];
  // The early loads of positions j < end: raw dt from the cache (before dt_end), B (where loads_B)
  // and x from B_at(j) and x_at(j).
  auto load_early = [&](int dt_end, int end, bool loads_B, const auto& B_at, const auto& x_at) {
    if (threadIdx.x < 32) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int j = threadIdx.x + 32 * h;
        if (j < dt_end) raw_dt[h] = __ldg(dt_hist + j);
      }
    }
    if (loads_B) {
#pragma unroll
      for (int r = 0; r < kEarlyRounds; ++r) {
        const int j = r * Ly::kRowGroups + group;
        if (j < end) load_slice_packs<Ly>(B_at(j), lane, N, b_early[r]);
      }
    }
#pragma unroll
    for (int u = 0; u < kEarlyX; ++u) {
      const int j = j_x + u * x_step;
      if (stages_x && j < end) x_early[u] = x_at(j);
    }
  };
  if constexpr (kSpeculative)
    load_early(L, L, may_use_B, [&](int j) { return B_hist + j * p.Bc_stride_pos; },
               [&](int j) { return load_one(x_hist + j * p.xc_stride_pos + i_x); });
  // Both kernels set their barrier up at entry (init_tile_barrier); the flush kernel's rows
  // complete its successive phases.
  start_tile_load<S, Ly>(tile, state, p.state_stride_p, w.rows, N, barrier, L2Hint::kEvictFirst,
                         kFlushOnly ? TileBarrier::kNextPhase : TileBarrier::kReady);
  const float A = widen(A_stored), bias = widen(bias_stored), D = widen(D_stored);
  const float raw_dt_now = widen(raw_dt_stored);
  float c[Ly::kVecsPerLane][Ly::kVec];
  widen_slice<Ly>(c_packs, c);
  float* scale = CheckpointFormat<S>::kScaled
                     ? p.state_scale + slot * p.scale_stride_slot + w.head * p.scale_stride_head + w.first
                     : nullptr;  // (rows)
  const float scale_mine =  // the row scale of chunk row threadIdx.x
      CheckpointFormat<S>::kScaled && int(threadIdx.x) < w.rows ? scale[threadIdx.x] : 1.f;
  if (cursor < 0 || cursor >= L) {      // a corrupt cursor: skip the row, touch nothing
    wait_tile<Ly>(barrier, tile_phase);  // (after the copy into this CTA's shared memory has landed)
    return;
  }

  const int count = cursor + 1;
  const bool flush = cursor == L - 1;
  const bool form_state = flush || !output_only;
  auto B_of = [&](int j) { return j < cursor ? B_hist + j * p.Bc_stride_pos : B_now; };
  auto x_of = [&](int j) {
    return load_one(j < cursor ? x_hist + j * p.xc_stride_pos + i_x : x_now + i_x);
  };
  auto stage_x = [&](int j, Act v) {
    x_s[j * pitch + i_x] = to_float(v);
    if (j == cursor && !flush) x_hist[cursor * p.xc_stride_pos + i_x] = v;
  };

  if constexpr (kSpeculative) {  // this step's token at the cursor
#pragma unroll
    for (int r = 0; r < kEarlyRounds; ++r) {
      if (r * Ly::kRowGroups + group == cursor) {
#pragma unroll
        for (int v = 0; v < Ly::kVecsPerLane; ++v) b_early[r][v] = b_now[v];
      }
    }
#pragma unroll
    for (int u = 0; u < kEarlyX; ++u) {
      if (j_x + u * x_step == cursor) x_early[u] = x_now_mine;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (int(threadIdx.x) + 32 * h >= cursor) raw_dt[h] = raw_dt_now;
    }
  } else {
    raw_dt[0] = raw_dt[1] = raw_dt_now;
    load_early(cursor, count, !form_state || kFlushOnly, B_of, x_of);
  }

  if (threadIdx.x < 32) {
    float dt[2];
    window_dt(raw_dt, cursor, bias, p.dt_softplus, dt);
    window_weights(dt, 0, cursor, A, window + kWeightsOffset, window + kDecayOffset);
    if (threadIdx.x == 0 && !flush && w.chunk == 0) dt_hist[cursor] = raw_dt_now;
  }
  // kFlushOnly: the window's B, widened into shared memory in lane order, one token per row group
  // and round.
  if constexpr (kFlushOnly) {
#pragma unroll
    for (int r = 0; r < kEarlyRounds; ++r) {
      const int j = r * Ly::kRowGroups + group;
      if (j < count) store_shared_slice<Ly>(B_s + j * N, b_early[r], lane, N);
    }
    for (int j = kEarlyRounds * Ly::kRowGroups + group; j < count; j += Ly::kRowGroups) {
      Pack<Act, Ly::kVec> b[Ly::kVecsPerLane];
      load_slice_packs<Ly>(B_of(j), lane, N, b);
      store_shared_slice<Ly>(B_s + j * N, b, lane, N);
    }
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
  if (gated && int(threadIdx.x) < w.rows) z_s[threadIdx.x] = to_float(z_mine);
  if (CheckpointFormat<S>::kScaled && int(threadIdx.x) < w.rows) scale_s[threadIdx.x] = scale_mine;
  if (appends_B && !flush) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = threadIdx.x + h * kThreads;
      if (n < N) B_hist[cursor * p.Bc_stride_pos + n] = B_mine[h];
    }
  }
  wait_tile_all<Ly>(barrier, tile_phase);

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
  auto weight_of = [&](int j, int i) { return i < w.rows ? window[kWeightsOffset + j] * x_s[j * pitch + i] : 0.f; };
  auto scale_row = [&](float (&s)[Ly::kVecsPerLane][Ly::kVec], int i) {
#pragma unroll
    for (int v = 0; v < Ly::kVecsPerLane; ++v) {
#pragma unroll
      for (int e = 0; e < Ly::kVec; ++e) s[v][e] *= decay * row_scale(i);
    }
  };
  auto store_flushed_row = [&](const float (&s)[Ly::kVecsPerLane][Ly::kVec], int i) {
    store_checkpoint_row<S, Ly>(state + i * p.state_stride_p, scale ? scale + i : nullptr, i < w.rows, s,
                                lane, N, kStochastic, random, uint32_t((w.head * p.head_dim + w.first + i) * N));
  };
  for (int batch = 0; batch < batches; ++batch) {
    float y[Ly::kRows];
    if constexpr (kFlushOnly) {  // the batch's rows together: each token's B slice is read once
      float s[Ly::kRows][Ly::kVecsPerLane][Ly::kVec];
#pragma unroll
      for (int k = 0; k < Ly::kRows; ++k) {
        const int i = chunk_row<Ly>(batch, k, group);
        tile_row<S, Ly>(tile, i, w.rows, lane, N, s[k]);
        scale_row(s[k], i);
      }
      for (int j = 0; j < count; ++j) {
        float b[Ly::kVecsPerLane][Ly::kVec];
        shared_slice<Ly>(B_s + j * N, lane, N, b);
#pragma unroll
        for (int k = 0; k < Ly::kRows; ++k) state_step<Ly>(s[k], 1.f, weight_of(j, chunk_row<Ly>(batch, k, group)), b);
      }
#pragma unroll
      for (int k = 0; k < Ly::kRows; ++k) {
        store_flushed_row(s[k], chunk_row<Ly>(batch, k, group));
        y[k] = slice_dot<Ly>(s[k], c);
      }
    } else {
#pragma unroll
      for (int k = 0; k < Ly::kRows; ++k) {
        const int i = chunk_row<Ly>(batch, k, group);
        float s[Ly::kVecsPerLane][Ly::kVec];
        tile_row<S, Ly>(tile, i, w.rows, lane, N, s);
        if (form_state) {  // one row at a time: its state stays in registers across the tokens
          scale_row(s, i);
          add_tokens<Ly, Act>(s, 0, count, lane, N, B_of, [&](int j) { return weight_of(j, i); });
          if (flush) store_flushed_row(s, i);
          y[k] = slice_dot<Ly>(s, c);
        } else {  // output-only: lane l adds the history terms of tokens l, l + kLanes, ...
          y[k] = decay * row_scale(i) * slice_dot<Ly>(s, c);
          if (i < w.rows) {
            for (int j = lane; j < count; j += Ly::kLanes) y[k] = fmaf(coef[j], x_s[j * pitch + i], y[k]);
          }
        }
      }
    }
    row_group_sums<Ly::kLanes>(y);
    store_outputs<Ly>(out, y, batch, group, lane, w.rows, D, x_s + cursor * pitch,
                      gated ? z_s : nullptr);
  }
}

// ReplaySSM standard decode: one (row, head, chunk) per CTA (replay_rows).
template <typename S, typename Act, RowLayoutKind kKind, bool kStochastic>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm) replay_decode_kernel(const ReplayParams p,
                                                                 int rows_per_cta,
                                                                 bool output_only) {
  extern __shared__ __align__(128) unsigned char smem[];
  init_tile_barrier<Layout<S, kKind>>(reinterpret_cast<uint64_t*>(smem));
  const int64_t slot = device_slot(p, blockIdx.y);  // first: see state_update_kernel
  const CtaWork w = cta_work(p, rows_per_cta);
  replay_rows<S, Act, kKind, kStochastic, false>(
      p, w, [&] { return slot; },
      [&](int64_t slot) { return load_one(p.cursors + slot * p.cursors_stride); }, rows_per_cta, output_only, smem);
}

// A flush CTA's shared memory (a whole fp32 head's tile, the window's x and B) admits four CTAs an
// SM: its registers are capped for four, not for the decode kernels' six, under whose cap the
// staged window spilled to local memory, one load round trip per token (notes/cuda.md, v14).
constexpr int kFlushMinCtasPerSm = 4;

// The split path's third kernel where the dot kernel does not fold the flush rows
// (dot_flush_part_rows_for), launched as the window kernel's programmatic dependent: the flush rows
// only (replay_rows, kFlushOnly), over a grid of (head, chunk) x (some CTAs per row of
// heads: flush_ctas_per_chunk) that takes them by rank. It runs beside the kernels before it
// without waiting for them: they touch no flush row's checkpoint. Every CTA waits for them before
// it exits, so that this kernel's completion implies theirs.
template <typename S, typename Act, RowLayoutKind kKind>
__global__ void __launch_bounds__(kThreads, kFlushMinCtasPerSm) replay_flush_kernel(const ReplayParams p,
                                                                     int rows_per_cta,
                                                                     bool output_only) {
  extern __shared__ __align__(128) unsigned char smem[];
  init_tile_barrier<Layout<S, kKind>>(reinterpret_cast<uint64_t*>(smem));
  const auto flush_slot = [&](int row) -> int64_t {
    const int64_t slot = device_slot(p, row);
    return slot >= 0 && load_one(p.cursors + slot * p.cursors_stride) == p.buffer_len - 1 ? slot : -1;
  };
  unsigned tiles = 0;  // loaded by this CTA
  for_each_selected_row(int(p.batch), flush_slot, [&](int row, int64_t slot) {
    replay_rows<S, Act, kKind, false, true>(
        p, cta_work(p, rows_per_cta, row), [&] { return slot; }, [&](int64_t) { return int(p.buffer_len) - 1; },
        rows_per_cta, output_only, smem, tiles++);
    __syncthreads();  // every thread is done with the tile before the next one's copy
  });
  wait_for_prior_kernel();
}

}  // namespace replayssm::cuda
