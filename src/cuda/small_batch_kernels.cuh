// The small-batch decode kernels: the baseline and ReplaySSM standard decode where the batch gives
// the GPU few state rows (vectorised layouts, fp32 and 16-bit states, rounding to nearest, the
// output-only route).
//
// At small batch a step is a chain of dependent round trips run by a few warps an SM, and its time
// follows the length of that chain rather than its bytes (notes/cuda.md, "Where the single kernel's
// instructions go"). These kernels keep the chain as short as it can be: a CTA of kThreads threads
// takes kSmallBatchRowsPerGroup<R> x row_groups head_dim rows of one (batch row, head), each row
// group R state rows held in registers, loaded straight from global memory (no tile, no barrier);
// the grid is (chunk, head, batch row), so a CTA finds its work without a division by a runtime
// value. The loads go out in two rounds: this step's inputs with the slot, then, once the slot is
// known, the state rows, the cursor and the history of every buffer position (the positions at and
// past the cursor are read and discarded: at small batch the bandwidth is idle and a round trip is
// not). The window's work is spread over the whole CTA: each row group forms B_j . C of its
// tokens, one warp the weights, each lane the history terms of its tokens of its rows.
#pragma once

#include "cuda/decode_primitives.cuh"

namespace replayssm::cuda {

// Registers for this many CTAs an SM (128 a thread): a whole wave of batch 1 runs four a SM.
constexpr int kSmallBatchMinCtasPerSm = 4;

// The (batch row, head, rows) of a small-batch CTA: row group `group` of the CTA holds head_dim
// rows first + group + k row_groups, k < R.
template <typename Ly, int R> struct SmallBatchCta {
  int row, head, group, lane, first;
  __device__ __forceinline__ SmallBatchCta() {
    row = int(blockIdx.z);
    head = int(blockIdx.y);
    group = int(threadIdx.x) / Ly::kLanes;
    lane = int(threadIdx.x) % Ly::kLanes;
    first = int(blockIdx.x) * Ly::kRowGroups * R + group;
  }
  __device__ __forceinline__ int head_dim_row(int k) const { return first + k * Ly::kRowGroups; }
};

// This step's per-row inputs of one head_dim row: x (as stored) and z (widened; 0 without a gate).
template <typename Act> struct RowInputs {
  Act x{};
  float z = 0.f;
};

template <typename Act, typename Ly, int R>
__device__ __forceinline__ void load_row_inputs(const Mamba2Params& p, const SmallBatchCta<Ly, R>& c,
                                                RowInputs<Act> (&in)[R]) {
  const Act* x = static_cast<const Act*>(p.x) + c.row * p.x_stride_batch + c.head * p.x_stride_head;
  const Act* z = p.z ? static_cast<const Act*>(p.z) + c.row * p.z_stride_batch + c.head * p.z_stride_head : nullptr;
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const int i = c.head_dim_row(k);
    if (i < p.head_dim) {
      in[k].x = load_one(x + i);
      if (z) in[k].z = to_float(load_one(z + i));
    }
  }
}

// Lane 0 of each row group writes its rows' outputs out_i = (y_i + D x_i) silu(z_i) (y summed over
// the row group here).
template <typename Act, typename Ly, int R>
__device__ __forceinline__ void store_small_batch_outputs(const Mamba2Params& p, const SmallBatchCta<Ly, R>& c,
                                                          float (&y)[R], const RowInputs<Act> (&in)[R], float D) {
  row_group_sums<Ly::kLanes>(y);
  Act* out = static_cast<Act*>(p.out) + c.row * p.out_stride_batch + c.head * p.out_stride_head;
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const int i = c.head_dim_row(k);
    if (c.lane == 0 && i < p.head_dim) {
      float v = y[k] + D * to_float(in[k].x);
      if (p.z) v *= silu(in[k].z);
      out[i] = from_float<Act>(v);
    }
  }
}

// Baseline: S = exp(A dt) S + dt x B^T, y = S C, on R state rows a row group.
template <typename S, typename Act, RowLayoutKind kKind, int R>
__global__ void __launch_bounds__(kThreads, kSmallBatchMinCtasPerSm) small_batch_state_update_kernel(
    const Mamba2Params p) {
  using Ly = Layout<S, kKind>;
  constexpr int N = Ly::kCoverN;
  const SmallBatchCta<Ly, R> c;
  const int64_t slot = device_slot(p, c.row);  // first: the state's loads wait for it alone
  const int g = c.head / int(p.heads_per_group);
  const StoredScalar A = load_head_scalar(p.A, c.head, 0.f);
  const StoredScalar raw_dt = load_stored(p.dt, p.dt_dtype, c.row * p.dt_stride_batch + c.head * p.dt_stride_head);
  const StoredScalar bias = load_head_scalar(p.dt_bias, c.head, 0.f);
  const StoredScalar D = load_head_scalar(p.D, c.head, 0.f);
  Pack<Act, Ly::kVec> b_packs[Ly::kVecsPerLane], c_packs[Ly::kVecsPerLane];
  load_slice_packs<Ly>(static_cast<const Act*>(p.B) + c.row * p.B_stride_batch + g * p.B_stride_group, c.lane, N,
                       b_packs);
  load_slice_packs<Ly>(static_cast<const Act*>(p.C) + c.row * p.C_stride_batch + g * p.C_stride_group, c.lane, N,
                       c_packs);
  RowInputs<Act> in[R];
  load_row_inputs<Act>(p, c, in);
  if (slot < 0) return;
  S* state = static_cast<S*>(p.state) + slot * p.state_stride_slot + c.head * p.state_stride_head;
  Pack<S, Ly::kVec> s_packs[R][Ly::kVecsPerLane] = {};
#pragma unroll
  for (int k = 0; k < R; ++k) {
    if (c.head_dim_row(k) < p.head_dim)
      load_slice_packs<Ly>(state + c.head_dim_row(k) * p.state_stride_p, c.lane, N, s_packs[k]);
  }

  const float dt = effective_dt(widen(raw_dt), widen(bias), p.dt_softplus);
  const float decay = expf(widen(A) * dt);
  float b[Ly::kVecsPerLane][Ly::kVec], cv[Ly::kVecsPerLane][Ly::kVec];
  widen_slice<Ly>(b_packs, b);
  widen_slice<Ly>(c_packs, cv);
  float y[R];
#pragma unroll
  for (int k = 0; k < R; ++k) {
    float s[Ly::kVecsPerLane][Ly::kVec];
    widen_slice<Ly>(s_packs[k], s);
    state_step<Ly>(s, decay, dt * to_float(in[k].x), b);
    y[k] = slice_dot<Ly>(s, cv);
    if (c.head_dim_row(k) < p.head_dim) store_row<S, Ly>(state + c.head_dim_row(k) * p.state_stride_p, s, c.lane, N);
  }
  store_small_batch_outputs<Act>(p, c, y, in, widen(D));
}

// ReplaySSM standard decode, output-only route, on R state rows a row group. The window is the
// cached history (positions 0 .. cursor-1) plus this step's token at position `cursor`. A non-flush
// row computes y = decay (S0 C) + sum_j weight_j (B_j . C) x_j and appends x, B (first head of the
// group, first chunk) and the raw dt (first chunk) at the cursor; a flush row (cursor == L-1) forms
// S = decay S0 + sum_j weight_j x_j B_j^T, stores it as the new checkpoint and outputs S C. The
// dynamic shared memory holds a flush row's B_j widened, L x N floats in lane order.
template <typename S, typename Act, RowLayoutKind kKind, int R>
__global__ void __launch_bounds__(kThreads, kSmallBatchMinCtasPerSm) small_batch_replay_kernel(
    const ReplayParams p) {
  using Ly = Layout<S, kKind>;
  constexpr int N = Ly::kCoverN;
  // B_j of a row group's first tokens is asked for with the state (as many as keep a lane's B
  // slices within 64 bytes), x_j of every position a lane takes (tokens lane + m kLanes).
  constexpr int kSliceBytes = Ly::kVecsPerLane * Ly::kVec * int(sizeof(Act));
  constexpr int kEarlyTokens = kSliceBytes <= 32 ? 2 : 1;
  constexpr int kLaneTokens = kMaxBufferLen / Ly::kLanes;
  __shared__ float weights[kMaxBufferLen], bc[kMaxBufferLen], decay_s;
  static_assert(sizeof(weights) + sizeof(bc) + sizeof(decay_s) == kSmallBatchReplayStaticBytes);
  extern __shared__ __align__(16) float staged_B[];  // (L, N), flush rows
  const SmallBatchCta<Ly, R> c;
  const int64_t slot = device_slot(p, c.row);  // first: every later load waits for it
  const int g = c.head / int(p.heads_per_group);
  const int L = int(p.buffer_len);
  const StoredScalar A_stored = load_head_scalar(p.A, c.head, 0.f);
  const StoredScalar bias_stored = load_head_scalar(p.dt_bias, c.head, 0.f);
  const StoredScalar D_stored = load_head_scalar(p.D, c.head, 0.f);
  const StoredScalar raw_dt_stored =
      load_stored(p.dt, p.dt_dtype, c.row * p.dt_stride_batch + c.head * p.dt_stride_head);
  Pack<Act, Ly::kVec> b_now[Ly::kVecsPerLane], c_packs[Ly::kVecsPerLane];
  load_slice_packs<Ly>(static_cast<const Act*>(p.B) + c.row * p.B_stride_batch + g * p.B_stride_group, c.lane, N,
                       b_now);
  load_slice_packs<Ly>(static_cast<const Act*>(p.C) + c.row * p.C_stride_batch + g * p.C_stride_group, c.lane, N,
                       c_packs);
  RowInputs<Act> in[R];
  load_row_inputs<Act>(p, c, in);
  if (slot < 0) return;

  // The second round: state rows, cursor, history.
  S* state = static_cast<S*>(p.state) + slot * p.state_stride_slot + c.head * p.state_stride_head;
  Pack<S, Ly::kVec> s_packs[R][Ly::kVecsPerLane] = {};
#pragma unroll
  for (int k = 0; k < R; ++k) {
    if (c.head_dim_row(k) < p.head_dim)
      load_slice_packs<Ly>(state + c.head_dim_row(k) * p.state_stride_p, c.lane, N, s_packs[k]);
  }
  const int cursor = load_one(p.cursors + slot * p.cursors_stride);
  float* dt_hist = p.dt_cache + slot * p.dtc_stride_slot + c.head * p.dtc_stride_head;  // (L)
  Act* B_hist = static_cast<Act*>(p.B_cache) + slot * p.Bc_stride_slot + g * p.Bc_stride_group;  // (L, N)
  Act* x_hist = static_cast<Act*>(p.x_cache) + slot * p.xc_stride_slot + c.head * p.xc_stride_head;  // (L, P)
  float raw_dt[2] = {0.f, 0.f};
  if (threadIdx.x < 32) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (int(threadIdx.x) + 32 * h < L) raw_dt[h] = __ldg(dt_hist + threadIdx.x + 32 * h);
  }
  Pack<Act, Ly::kVec> b_early[kEarlyTokens][Ly::kVecsPerLane] = {};
#pragma unroll
  for (int r = 0; r < kEarlyTokens; ++r) {
    const int j = c.group + r * Ly::kRowGroups;
    if (j < L) load_slice_packs<Ly>(B_hist + j * p.Bc_stride_pos, c.lane, N, b_early[r]);
  }
  Act x_early[R][kLaneTokens] = {};
#pragma unroll
  for (int k = 0; k < R; ++k) {
#pragma unroll
    for (int m = 0; m < kLaneTokens; ++m) {
      const int j = c.lane + m * Ly::kLanes;
      if (j < L && c.head_dim_row(k) < p.head_dim) x_early[k][m] = load_one(x_hist + j * p.xc_stride_pos + c.head_dim_row(k));
    }
  }
  if (cursor < 0 || cursor >= L) return;  // a corrupt cursor: skip the row, touch nothing

  const bool flush = cursor == L - 1;
  const bool appends = !flush && blockIdx.x == 0;  // the first chunk appends B and dt
  const float raw_dt_now = widen(raw_dt_stored);
  if (threadIdx.x < 32) {  // one warp: the window's weights and decay
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (int(threadIdx.x) + 32 * h == cursor) raw_dt[h] = raw_dt_now;
    float dt[2];
    window_dt(raw_dt, cursor, widen(bias_stored), p.dt_softplus, dt);
    window_weights(dt, 0, cursor, widen(A_stored), weights, &decay_s);
    if (threadIdx.x == 0 && appends) dt_hist[cursor] = raw_dt_now;
  }
  // Row group g takes tokens g, g + row_groups, ...: B_j . C (kept for the non-flush rows), or B_j
  // staged for the fold (flush rows). Rounds past the early tokens load their B_j here.
  const bool appends_B = appends && c.head % int(p.heads_per_group) == 0;
  float cv[Ly::kVecsPerLane][Ly::kVec];
  widen_slice<Ly>(c_packs, cv);
  auto take_token = [&](int j, const Pack<Act, Ly::kVec> (&cached)[Ly::kVecsPerLane]) {
    const bool now = j == cursor;
    Pack<Act, Ly::kVec> packs[Ly::kVecsPerLane];
#pragma unroll
    for (int v = 0; v < Ly::kVecsPerLane; ++v) packs[v] = now ? b_now[v] : cached[v];
    if (flush) {
      if (j <= cursor) store_shared_slice<Ly>(staged_B + j * N, packs, c.lane, N);
      return;
    }
    float b[Ly::kVecsPerLane][Ly::kVec];
    widen_slice<Ly>(packs, b);
    float dot[1] = {slice_dot<Ly>(b, cv)};
    row_group_sums<Ly::kLanes>(dot);  // every lane of the warp: j is uniform over the CTA's rounds
    if (c.lane == 0 && j <= cursor) bc[j] = dot[0];
    if (now && appends_B) {
#pragma unroll
      for (int v = 0; v < Ly::kVecsPerLane; ++v) store_pack(B_hist + cursor * p.Bc_stride_pos + first_element<Ly>(v, c.lane), b_now[v]);
    }
  };
#pragma unroll
  for (int r = 0; r < kEarlyTokens; ++r) {
    if (r * Ly::kRowGroups <= cursor) take_token(c.group + r * Ly::kRowGroups, b_early[r]);
  }
  for (int j0 = kEarlyTokens * Ly::kRowGroups; j0 <= cursor; j0 += Ly::kRowGroups) {
    const int j = j0 + c.group;
    Pack<Act, Ly::kVec> cached[Ly::kVecsPerLane] = {};
    if (j < cursor) load_slice_packs<Ly>(B_hist + j * p.Bc_stride_pos, c.lane, N, cached);
    take_token(j, cached);
  }
  // The window's x of each row: this step's at the cursor, appended there by non-flush rows.
  float xw[R][kLaneTokens];
#pragma unroll
  for (int k = 0; k < R; ++k) {
#pragma unroll
    for (int m = 0; m < kLaneTokens; ++m) {
      const int j = c.lane + m * Ly::kLanes;
      xw[k][m] = j == cursor ? to_float(in[k].x) : j < cursor ? to_float(x_early[k][m]) : 0.f;
    }
    const int i = c.head_dim_row(k);
    if (!flush && c.lane == cursor % Ly::kLanes && i < p.head_dim) x_hist[cursor * p.xc_stride_pos + i] = in[k].x;
  }
  __syncthreads();  // weights, decay, B_j . C or the staged B

  const float decay = decay_s;
  float y[R];
#pragma unroll
  for (int k = 0; k < R; ++k) {
    float s[Ly::kVecsPerLane][Ly::kVec];
    widen_slice<Ly>(s_packs[k], s);
    if (!flush) {  // lane l adds the history terms of its tokens l, l + kLanes, ...
      float hist = 0.f;
#pragma unroll
      for (int m = 0; m < kLaneTokens; ++m) {
        const int j = c.lane + m * Ly::kLanes;
        if (j <= cursor) hist = fmaf(weights[j] * bc[j], xw[k][m], hist);
      }
      y[k] = fmaf(decay, slice_dot<Ly>(s, cv), hist);
    } else {  // the fold, token by token, x_j of the row from the lane that holds it
#pragma unroll
      for (int v = 0; v < Ly::kVecsPerLane; ++v) {
#pragma unroll
        for (int e = 0; e < Ly::kVec; ++e) s[v][e] *= decay;
      }
#pragma unroll
      for (int m = 0; m < kLaneTokens; ++m) {
        if (m * Ly::kLanes >= L) break;
#pragma unroll
        for (int l = 0; l < Ly::kLanes; ++l) {
          const int j = l + m * Ly::kLanes;
          const float x_j = __shfl_sync(kFullMask, xw[k][m], l, Ly::kLanes);
          if (j < L) {
            float b[Ly::kVecsPerLane][Ly::kVec];
            shared_slice<Ly>(staged_B + j * N, c.lane, N, b);
            state_step<Ly>(s, 1.f, weights[j] * x_j, b);
          }
        }
      }
      const int i = c.head_dim_row(k);
      if (i < p.head_dim) store_row<S, Ly>(state + i * p.state_stride_p, s, c.lane, N);
      y[k] = slice_dot<Ly>(s, cv);
    }
  }
  store_small_batch_outputs<Act>(p, c, y, in, widen(D_stored));
}

}  // namespace replayssm::cuda
