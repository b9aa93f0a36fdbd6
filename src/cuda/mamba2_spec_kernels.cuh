// Speculative decoding kernels: ReplaySSM verify and the baseline speculative path, built from the
// pieces of the decode kernels (decode_primitives.cuh). Included by the per-state-dtype
// instantiation files (mamba2_spec_*.cu) only.
//
// As in standard decode, one CTA handles one (batch row, head, chunk of head_dim rows): its first
// thread bulk-copies the chunk's state rows into shared memory while the CTA stages the window.
// Each row group then holds a few state rows in registers for every position of the window, so
// the state is read once per verify step; the T outputs of a row are reduced together.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "api/spec_params.hpp"
#include "cuda/check.hpp"
#include "cuda/decode_primitives.cuh"
#include "cuda/launch_shape.hpp"
#include "cuda/mamba2_spec_launch.hpp"

namespace replayssm::cuda::spec {

// Registers for kRows state rows and their T sums, capped so that as many CTAs fit an SM as the
// shared memory of a whole head with its window allows: four with an fp32 state, five with a
// 16-bit one.
template <typename S> constexpr int kMinCtasPerSm = sizeof(S) == 4 ? 4 : 5;
constexpr int kWarps = kThreads / 32;
constexpr int kStagedTokens = 16;  // loads in flight per thread while staging x

// The window's per-position values of one (row, head): token t of a window tensor sits at
// base + t * token_stride.
template <typename T> __device__ __forceinline__ const T* token(const void* base, int64_t offset, int64_t t,
                                                               int64_t token_stride) {
  return static_cast<const T*>(base) + offset + t * token_stride;
}

// The sums over a row group of kLanes lanes of kValues values a lane, by a transposing butterfly:
// at each level a lane keeps half of its values and trades the other half, so that one shuffle
// per traded value replaces one per value and level. Afterwards a lane holds held_sums() sums in
// v[0 ..): those of values held_value(lane, r).
template <int kLanes, int kValues> constexpr int held_sums() {
  return kValues >= kLanes ? kValues / kLanes : 1;
}
template <int kLanes, int kValues> __device__ __forceinline__ int held_value(int lane, int r) {
  return kValues >= kLanes ? lane * (kValues / kLanes) + r : lane / (kLanes / kValues);
}
// One level per call: the kLanes-lane groups become kLanes / 2-lane groups; a lane has kCount
// values left (the compile-time counts keep the values in registers).
template <int kLanes, int kCount, int kValues>
__device__ __forceinline__ void transposed_sums(float (&v)[kValues], int lane) {
  static_assert((kLanes & (kLanes - 1)) == 0 && (kCount & (kCount - 1)) == 0, "powers of two");
  if constexpr (kLanes > 1) {
    constexpr int kOffset = kLanes / 2;
    if constexpr (kCount > 1) {
      constexpr int kHalf = kCount / 2;
      const bool upper = lane & kOffset;
#pragma unroll
      for (int k = 0; k < kHalf; ++k) {
        const float low = v[k], high = v[k + kHalf];
        const float received = __shfl_xor_sync(kFullMask, upper ? low : high, kOffset);
        v[k] = (upper ? high : low) + received;
      }
      transposed_sums<kOffset, kHalf>(v, lane);
    } else {
      v[0] += __shfl_xor_sync(kFullMask, v[0], kOffset);
      transposed_sums<kOffset, 1>(v, lane);
    }
  }
}

// The outputs of a batch of rows. y[t * kRows + k]: this lane's part of output t of row k of its
// row group; out_t[i] = (scale_t sum + add_t[i]) * silu(z_t[i]) for the n valid positions, with
// scale_t = scale[t] (or 1) and add, z (T, rows_per_cta) in shared memory.
template <typename Ly, typename Act, int kValues>
__device__ __forceinline__ void store_window_outputs(const WindowParams& p, const CtaWork& w,
                                                     float (&y)[kValues], int n,
                                                     int batch, int group, int lane, int rows_per_cta,
                                                     const float* scale, const float* add, const float* z) {
  transposed_sums<Ly::kLanes, kValues>(y, lane);
  // With fewer values than lanes, kLanes / kValues lanes hold each sum; the first writes it.
  if (kValues < Ly::kLanes && lane % (Ly::kLanes / kValues) != 0) return;
#pragma unroll
  for (int r = 0; r < held_sums<Ly::kLanes, kValues>(); ++r) {
    const int value = held_value<Ly::kLanes, kValues>(lane, r);
    const int t = value / Ly::kRows, i = chunk_row<Ly>(batch, value % Ly::kRows, group);
    if (t < n && i < w.rows) {
      const int ti = t * rows_per_cta + i;
      float v = (scale ? scale[t] * y[r] : y[r]) + add[ti];
      if (z) v *= silu(z[ti]);
      Act* out = static_cast<Act*>(p.out) + w.row * p.out_stride_batch + t * p.out_stride_token +
                 w.head * p.out_stride_head + w.first;
      out[i] = from_float<Act>(v);
    }
  }
}

// This lane's parts of the dots S_k . C_t of the thread's rows of a batch (s[k]: its slice of row
// k) with the window's n staged C_t (C_s: T x N, in lane order): y[t * kRows + k], zero for t >= n.
template <typename Ly, int kMaxT>
__device__ __forceinline__ void window_dots(const float (&s)[Ly::kRows][Ly::kVecsPerLane][Ly::kVec], const float* C_s,
                                            int n, int lane, int64_t N, float (&y)[kMaxT * Ly::kRows]) {
#pragma unroll
  for (int t = 0; t < kMaxT; ++t) {
    float c_t[Ly::kVecsPerLane][Ly::kVec];
    if (t < n) shared_slice<Ly>(C_s + t * N, lane, N, c_t);
#pragma unroll
    for (int k = 0; k < Ly::kRows; ++k) y[t * Ly::kRows + k] = t < n ? slice_dot<Ly>(s[k], c_t) : 0.f;
  }
}

// The sums of a batch of rows for each position of a window (y[t * kRows + k]: this lane's part
// of position t of row k of its row group) into the split path's workspace: dots[t * t_stride + i]
// for the n valid positions and the rows i below `rows`.
template <typename Ly, int kValues>
__device__ __forceinline__ void store_dots(float* dots, int64_t t_stride, float (&y)[kValues], int n, int rows,
                                           int batch, int group, int lane) {
  transposed_sums<Ly::kLanes, kValues>(y, lane);
  if (kValues < Ly::kLanes && lane % (Ly::kLanes / kValues) != 0) return;
#pragma unroll
  for (int h = 0; h < held_sums<Ly::kLanes, kValues>(); ++h) {
    const int value = held_value<Ly::kLanes, kValues>(lane, h);
    const int t = value / Ly::kRows, i = chunk_row<Ly>(batch, value % Ly::kRows, group);
    if (t < n && i < rows) dots[t * t_stride + i] = y[h];
  }
}

// A verify row's ring and window as every kernel of a verify sees them: valid when the ring and
// the row's token count are in range (a corrupt row is skipped, touching nothing); flush per
// spec_flushes.
struct VerifyRow {
  int origin, committed, tokens;
  bool valid, flush;
};
__device__ __forceinline__ VerifyRow verify_row(const SpecVerifyParams& p, int row, int64_t slot) {
  const int T = int(p.window), L = int(p.buffer_len);
  const int32_t* ring = p.ring + slot * p.ring_stride_slot;
  VerifyRow r;
  r.origin = load_one(ring);
  r.committed = load_one(ring + p.ring_stride_field);
  r.tokens = p.num_valid_tokens ? load_one(p.num_valid_tokens + row * p.num_valid_tokens_stride) : T;
  r.valid = r.origin >= 0 && r.origin < p.ring_len && r.committed >= 0 && r.committed <= L - T &&
            r.tokens >= 1 && r.tokens <= T;
  r.flush = r.valid && spec_flushes(r.committed, T, L);
  return r;
}

// ReplaySSM verify of one CTA's (row, head, chunk). Token j of a row: j < c the committed inputs
// in the ring, then the window's n tokens. Output t sees tokens [first, c + t], where first = c on
// a flush row (whose checkpoint absorbs the committed inputs first) and 0 otherwise:
//   y_t = decay_t (S C_t) + hist_t,  hist_t = sum_j weight_{j,t} (B_j . C_t) x_j + D x_{c+t}
// The window work (hist, weights, B_j . C_t) is done once per CTA while the tile is in flight;
// the row loop then only forms the dot products S C_t (and, on a flush row, the folded state).
// kFoldOnly (the split path's flush kernel, flush rows only): only the fold and the dots S C_t of
// the folded state, into the workspace; the window kernel forms the outputs and appends the
// window to the ring. kMaxT: T rounded up to 4 or 8 (the sums held in registers). tile_phase
// (kFoldOnly): of the flush kernel CTA's tile barrier, the phase this row's tile completes.
template <typename S, typename Act, RowLayoutKind kKind, bool kFoldOnly, int kMaxT>
__device__ __forceinline__ void verify_rows(const SpecVerifyParams& p, const CtaWork& w, int64_t slot,
                                            int rows_per_cta, bool x_slices, unsigned char* smem,
                                            unsigned tile_phase = 0) {
  using Ly = Layout<S, kKind>;
  uint64_t* barrier = reinterpret_cast<uint64_t*>(smem);
  const int64_t N = p.state_dim;
  const int T = int(p.window), L = int(p.buffer_len), mask = int(p.ring_len) - 1;
  const int pitch = int(window_pitch(rows_per_cta, Ly::kLanes));
  const SpecVerifySmem layout = spec_verify_smem(rows_per_cta, N, T, L, Ly::kLanes);
  S* tile = reinterpret_cast<S*>(smem + kTileOffset);  // (rows, N)
  float* floats = reinterpret_cast<float*>(smem + kTileOffset + tile_bytes(rows_per_cta, N, sizeof(S)));
  float* coef = floats + layout.coef;
  float* fold = floats + layout.fold;
  float* decay = floats + layout.decay;
  float* B_s = floats + layout.B;
  float* C_s = floats + layout.C;
  float* z_s = floats + layout.z;
  float* hist = floats + layout.hist;
  float* x_s = floats + layout.x;
  const int lane = threadIdx.x % Ly::kLanes, group = threadIdx.x / Ly::kLanes;
  const int warp = threadIdx.x / 32;
  S* state = chunk_state<S>(p, w, slot);  // (rows, N)
  start_tile_load<S, Ly>(tile, state, p.state_stride_p, w.rows, N, barrier, L2Hint::kEvictFirst,
                         kFoldOnly ? TileBarrier::kNextPhase : TileBarrier::kSetUp);

  const VerifyRow r = verify_row(p, w.row, slot);
  const int origin = r.origin, c = r.committed, n = r.tokens;
  const float A = head_value(p.A, w.head, 0.f), bias = head_value(p.dt_bias, w.head, 0.f);
  const float D = head_value(p.D, w.head, 0.f);
  if (!r.valid) {                        // corrupt: touch nothing
    wait_tile<Ly>(barrier, tile_phase);  // (after the copy into this CTA's shared memory has landed)
    return;
  }
  const bool flush = r.flush;
  const int first = flush ? c : 0, count = c + n;
  const int staged = kFoldOnly ? c : count;  // the tokens whose B and x are staged

  // Token j's inputs: the ring below c, the window from c on.
  const int g = w.group;
  Act* B_ring = static_cast<Act*>(p.B_cache) + slot * p.Bc_stride_slot + g * p.Bc_stride_group;
  Act* x_ring = static_cast<Act*>(p.x_cache) + slot * p.xc_stride_slot + w.head * p.xc_stride_head + w.first;
  float* dt_ring = p.dt_cache + slot * p.dtc_stride_slot + w.head * p.dtc_stride_head;
  const int64_t B_offset = w.row * p.B_stride_batch + g * p.B_stride_group;
  const int64_t x_offset = w.row * p.x_stride_batch + w.head * p.x_stride_head + w.first;
  const int64_t dt_offset = w.row * p.dt_stride_batch + w.head * p.dt_stride_head;
  auto position = [&](int j) { return (origin + j) & mask; };
  auto B_of = [&](int j) -> const Act* {
    return j < c ? B_ring + position(j) * p.Bc_stride_pos : token<Act>(p.B, B_offset, j - c, p.B_stride_token);
  };
  auto x_of = [&](int j) -> const Act* {
    return j < c ? x_ring + position(j) * p.xc_stride_pos : token<Act>(p.x, x_offset, j - c, p.x_stride_token);
  };
  auto raw_dt_of = [&](int j) {
    return j < c ? __ldg(dt_ring + position(j)) : widen(load_stored(p.dt, p.dt_dtype, dt_offset + (j - c) * p.dt_stride_token));
  };

  // Every warp reads the raw dt of the tokens (two a lane); B, C, x and z are staged (widened),
  // and the window's x, dt and B appended to the ring at positions c .. c + n - 1, uncommitted.
  float raw_dt[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int j = threadIdx.x % 32 + 32 * h;
    raw_dt[h] = j < staged ? raw_dt_of(j) : 0.f;
  }
  // B: one token per row group at a time, in the layout's slices (16-byte or 8-byte accesses on
  // the vectorised layouts, whose alignment the host checked); C of every output; x of every token
  // for the chunk's rows: with x_slices (the host checked 16-byte alignment of every x row and
  // chunk) one 16-byte access a thread, a pass covering kThreads / vectors tokens, otherwise one
  // element a thread, kStagedTokens tokens' loads before their stores; z. A thread asks for its
  // values of the first kStageRounds rounds of B, of C, of the first pass of x and of z before it
  // stores any: the stores could alias the loads for all the compiler knows, which would
  // serialise one memory round trip a stage (the longer windows' further rounds follow, each a
  // round trip). kFoldOnly (the flush kernel, whose registers that spills) keeps a round trip a
  // stage. Thread (i, j0) also forms the history sums of row i for outputs j0, j0 + x_step, ...
  // below.
  const bool appends_B = !kFoldOnly && w.chunk == 0 && w.head == g * int(p.heads_per_group);
  const bool appends_x = !kFoldOnly;
  constexpr bool kEarly = !kFoldOnly;
  constexpr int kStageRounds = kEarly ? 2 : 0, kCRounds = kMaxStateDim / kThreads;
  auto stage_B = [&](int j, const Pack<Act, Ly::kVec> (&b)[Ly::kVecsPerLane]) {
    store_shared_slice<Ly>(B_s + j * N, b, lane, N);
    if (appends_B && j >= c) {
#pragma unroll
      for (int v = 0; v < Ly::kVecsPerLane; ++v) {
        const int column = first_element<Ly>(v, lane);
        if (!Ly::kMasked || column < N) store_pack(B_ring + position(j) * p.Bc_stride_pos + column, b[v]);
      }
    }
  };
  Pack<Act, Ly::kVec> b_early[kEarly ? kStageRounds : 1][Ly::kVecsPerLane];
#pragma unroll
  for (int q = 0; q < kStageRounds; ++q) {
    const int j = group + q * Ly::kRowGroups;
    if (j < staged) load_slice_packs<Ly>(B_of(j), lane, N, b_early[q]);
  }
  Act C_v[kCRounds][kMaxT];
  auto load_C = [&](int q) {
    const int k = int(threadIdx.x) + q * kThreads;
#pragma unroll
    for (int t = 0; t < kMaxT; ++t)
      if (k < N && t < n)
        C_v[q][t] = load_one(token<Act>(p.C, w.row * p.C_stride_batch + g * p.C_stride_group + k, t, p.C_stride_token));
  };
  if constexpr (kEarly) {
#pragma unroll
    for (int q = 0; q < kCRounds; ++q) load_C(q);
  }
  constexpr int kXVec = 16 / int(sizeof(Act));
  // With x_slices: thread x_i / kXVec of a pass of tokens_per_pass tokens from x_j.
  auto x_pass = [&](int& x_i, int& x_j, int& tokens_per_pass) {
    const int vectors = x_slices ? rows_per_cta / kXVec : 1;
    tokens_per_pass = kThreads / vectors;
    x_i = threadIdx.x % vectors * kXVec;
    x_j = threadIdx.x / vectors;
    return x_slices && x_i < w.rows && int(threadIdx.x) < tokens_per_pass * vectors;
  };
  Pack<Act, kXVec> x_early{};
  if constexpr (kEarly) {
    int x_i, x_j, tokens_per_pass;
    if (x_pass(x_i, x_j, tokens_per_pass) && x_j < staged) x_early = load_pack<Act, kXVec>(x_of(x_j) + x_i);
  }
  const bool stages_z = !kFoldOnly && p.z && int(threadIdx.x) < w.rows;
  Act z_v[kMaxT];
  if (stages_z) {
    const int64_t z_offset = w.row * p.z_stride_batch + w.head * p.z_stride_head + w.first + threadIdx.x;
#pragma unroll
    for (int t = 0; t < kMaxT; ++t)
      if (t < n) z_v[t] = load_one(token<Act>(p.z, z_offset, t, p.z_stride_token));
  }

#pragma unroll
  for (int q = 0; q < kStageRounds; ++q) {
    const int j = group + q * Ly::kRowGroups;
    if (j < staged) stage_B(j, b_early[q]);
  }
  for (int j = group + kStageRounds * Ly::kRowGroups; j < staged; j += Ly::kRowGroups) {
    Pack<Act, Ly::kVec> b[Ly::kVecsPerLane];
    load_slice_packs<Ly>(B_of(j), lane, N, b);
    stage_B(j, b);
  }
#pragma unroll
  for (int q = 0; q < kCRounds; ++q) {
    if constexpr (!kEarly) load_C(q);
    const int k = int(threadIdx.x) + q * kThreads;
#pragma unroll
    for (int t = 0; t < kMaxT; ++t)
      if (k < N && t < n) C_s[t * N + shared_position<Ly>(k)] = to_float(C_v[q][t]);
  }
  const int x_step = kThreads / rows_per_cta;
  const int x_row = threadIdx.x % rows_per_cta, x_first = threadIdx.x / rows_per_cta;
  const bool stages_x = x_row < w.rows && x_first < x_step;
  int x_i, x_j, tokens_per_pass;
  if (x_pass(x_i, x_j, tokens_per_pass)) {
    auto stage_x = [&](int j, const Pack<Act, kXVec>& v) {
#pragma unroll
      for (int e = 0; e < kXVec; ++e) x_s[j * pitch + x_i + e] = to_float(v.v[e]);
      if (appends_x && j >= c) store_pack(x_ring + position(j) * p.xc_stride_pos + x_i, v);
    };
    if (kEarly && x_j < staged) stage_x(x_j, x_early);
    for (int j = x_j + (kEarly ? tokens_per_pass : 0); j < staged; j += tokens_per_pass)
      stage_x(j, load_pack<Act, kXVec>(x_of(j) + x_i));
  } else if (!x_slices && stages_x) {
    for (int j0 = x_first; j0 < staged; j0 += kStagedTokens * x_step) {
      Act v[kStagedTokens];
#pragma unroll
      for (int u = 0; u < kStagedTokens; ++u)
        if (j0 + u * x_step < staged) v[u] = load_one(x_of(j0 + u * x_step) + x_row);
#pragma unroll
      for (int u = 0; u < kStagedTokens; ++u) {
        const int j = j0 + u * x_step;
        if (j >= staged) break;
        x_s[j * pitch + x_row] = to_float(v[u]);
        if (appends_x && j >= c) x_ring[position(j) * p.xc_stride_pos + x_row] = v[u];
      }
    }
  }
  if (stages_z) {
#pragma unroll
    for (int t = 0; t < kMaxT; ++t)
      if (t < n) z_s[t * rows_per_cta + threadIdx.x] = to_float(z_v[t]);
  }
  if (!kFoldOnly && w.chunk == 0 && int(threadIdx.x) < n)
    dt_ring[position(c + threadIdx.x)] = raw_dt_of(c + threadIdx.x);
  // Warp u % kWarps: the weights of output u over [first, c + u], and after the outputs, on a
  // flush row, those of the committed inputs [0, c) that the fold adds to the checkpoint.
  float dt[2];
  window_dt(raw_dt, c + n - 1, bias, p.dt_softplus, dt);
  for (int u = (kFoldOnly ? n : 0) + warp; u < n + (flush ? 1 : 0); u += kWarps) {
    if (u < n) window_weights(dt, first, c + u, A, coef + u * kMaxBufferLen, decay + u);
    else window_weights(dt, 0, c - 1, A, fold, decay + kMaxSpecWindow);
  }
  __syncthreads();

  // On a flush row, the fold's weights into the committed inputs' staged x: weight_j x_j[i].
  if (flush && stages_x) {
    for (int j = x_first; j < c; j += x_step) x_s[j * pitch + x_row] *= fold[j];
  }
  // The history coefficients: coef[t][j] = weight_{j,t} (B_j . C_t), one token per row group at a
  // time, its dots with every output's C summed over the row group together (one chain of
  // shuffles a token, not one a dot).
  for (int j0 = first; !kFoldOnly && j0 < count; j0 += Ly::kRowGroups) {
    const int j = j0 + group;
    float b[Ly::kVecsPerLane][Ly::kVec];
    shared_slice<Ly>(B_s + min(j, count - 1) * N, lane, N, b);
    float dots[kMaxT];
#pragma unroll
    for (int t = 0; t < kMaxT; ++t) {
      float c_t[Ly::kVecsPerLane][Ly::kVec];
      if (t < n) shared_slice<Ly>(C_s + t * N, lane, N, c_t);
      dots[t] = t < n ? slice_dot<Ly>(b, c_t) : 0.f;
    }
    row_group_sums<Ly::kLanes>(dots);
#pragma unroll
    for (int t = 0; t < kMaxT; ++t)
      if (lane == 0 && t < n && j < count && j <= c + t) coef[t * kMaxBufferLen + j] *= dots[t];
  }
  __syncthreads();
  // hist[t][i], one (row, output) pair per thread at a time.
  if (!kFoldOnly && stages_x) {
    for (int t = x_first; t < n; t += x_step) {
      const float* coef_t = coef + t * kMaxBufferLen;
      float sum = D * x_s[(c + t) * pitch + x_row];
      for (int j = first; j <= c + t; ++j) sum = fmaf(coef_t[j], x_s[j * pitch + x_row], sum);
      hist[t * rows_per_cta + x_row] = sum;
    }
  }
  wait_tile_all<Ly>(barrier, tile_phase);

  const float fold_decay = decay[kMaxSpecWindow];
  const int batches = (w.rows + Ly::kBatchRows - 1) / Ly::kBatchRows;
  for (int batch = 0; batch < batches; ++batch) {
    float s[Ly::kRows][Ly::kVecsPerLane][Ly::kVec];
#pragma unroll
    for (int k = 0; k < Ly::kRows; ++k) tile_row<S, Ly>(tile, chunk_row<Ly>(batch, k, group), w.rows, lane, N, s[k]);
    if (flush) {  // the checkpoint becomes the state after the committed inputs
#pragma unroll
      for (int k = 0; k < Ly::kRows; ++k) {
#pragma unroll
        for (int v = 0; v < Ly::kVecsPerLane; ++v) {
#pragma unroll
          for (int e = 0; e < Ly::kVec; ++e) s[k][v][e] *= fold_decay;
        }
      }
      for (int j = 0; j < c; ++j) {
        float b[Ly::kVecsPerLane][Ly::kVec];
        shared_slice<Ly>(B_s + j * N, lane, N, b);
#pragma unroll
        for (int k = 0; k < Ly::kRows; ++k) {
          const int i = chunk_row<Ly>(batch, k, group);
          state_step<Ly>(s[k], 1.f, i < w.rows ? x_s[j * pitch + i] : 0.f, b);
        }
      }
#pragma unroll
      for (int k = 0; k < Ly::kRows; ++k) {
        const int i = chunk_row<Ly>(batch, k, group);
        if (i < w.rows) store_row<S, Ly>(state + i * p.state_stride_p, s[k], lane, N);
      }
    }
    float y[kMaxT * Ly::kRows];
    window_dots<Ly, kMaxT>(s, C_s, n, lane, N, y);
    if constexpr (kFoldOnly)
      store_dots<Ly>(p.workspace + (int64_t(w.row) * T * p.nheads + w.head) * p.head_dim + w.first,
                     p.nheads * p.head_dim, y, n, w.rows, batch, group, lane);
    else
      store_window_outputs<Ly, Act>(p, w, y, n, batch, group, lane, rows_per_cta, decay, hist,
                                    p.z ? z_s : nullptr);
  }
}

// ReplaySSM verify in one kernel: every row (verify_rows).
template <typename S, typename Act, RowLayoutKind kKind, int kMaxT>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm<S>) verify_kernel(const SpecVerifyParams p,
                                                                            int rows_per_cta,
                                                                            bool x_slices) {
  extern __shared__ __align__(128) unsigned char smem[];
  const CtaWork w = cta_work(p, rows_per_cta);
  const int64_t slot = device_slot(p, w.row);
  if (slot < 0) return;
  verify_rows<S, Act, kKind, false, kMaxT>(p, w, slot, rows_per_cta, x_slices, smem);
}

// ---- The split path (a workspace, vectorised layouts), as in standard decode ----------------------
//
// 1. dot_kernel: a lean read of the checkpoints, S_i . C_t into the workspace; a flush row's CTA
//    folds its committed inputs into its checkpoint first (where they leave room in its tile);
// 2. flush_kernel, its programmatic dependent where they do not: the flush rows' fold
//    (verify_rows, kFoldOnly) and the dots S_i . C_t of the folded checkpoints;
// 3. window_kernel, the programmatic dependent of the kernel before: every row's window work once
//    per (row, heads of one group), the appends to the ring and the outputs from the dots.
// The first two touch disjoint rows, so the flush kernel's CTAs may start as soon as SMs free up
// from the dot kernel; each kernel waits for the one before it only where it reads its results
// (the window kernel, for the dots) or at its exit, so that the last one's completion implies
// every one's.

// The split path's second kernel: the flush rows only, taken by rank over a grid of some CTAs per
// (head, chunk) (flush_ctas_per_chunk). Its registers are capped for four CTAs an SM with every
// state type, as the fused kernel's are for an fp32 state.
constexpr int kFlushMinCtasPerSm = 4;
template <typename S, typename Act, RowLayoutKind kKind, int kMaxT>
__global__ void __launch_bounds__(kThreads, kFlushMinCtasPerSm) flush_kernel(const SpecVerifyParams p,
                                                                           int rows_per_cta,
                                                                           bool x_slices) {
  extern __shared__ __align__(128) unsigned char smem[];
  allow_dependent_launch();  // the window kernel may start its window work now
  init_tile_barrier<Layout<S, kKind>>(reinterpret_cast<uint64_t*>(smem));
  const auto flush_slot = [&](int row) -> int64_t {
    const int64_t slot = device_slot(p, row);
    return slot >= 0 && verify_row(p, row, slot).flush ? slot : -1;
  };
  unsigned tiles = 0;  // loaded by this CTA
  for_each_selected_row(int(p.batch), flush_slot, [&](int row, int64_t slot) {
    verify_rows<S, Act, kKind, true, kMaxT>(p, cta_work(p, rows_per_cta, row), slot, rows_per_cta, x_slices, smem,
                                            tiles++);
    __syncthreads();  // every thread is done with the tile before the next one's copy
  });
  wait_for_prior_kernel();
}

// Registers of the dot kernel capped for six CTAs an SM, as standard decode's (dot_shape).
constexpr int kDotMinCtasPerSm = 6;

// A flush row's committed inputs staged for fold_staged_tile by a CTA of the dot kernel: the rows
// of its heads (d.rows of each from d.first), the ring's B and x of the c committed tokens by
// asynchronous copies of 4 elements (the split path's alignment), and each head's fold weights
// over them, at the end of a tile of `capacity` rows (a head's last chunk may have fewer rows,
// and its first part must stay clear of them). Complete after wait_async_copies and a CTA barrier.
template <typename S, typename Act>
__device__ __forceinline__ StagedFold<Act> stage_committed(const SpecVerifyParams& p, const DotCta& d, int64_t slot,
                                                           const VerifyRow& r, int heads, int capacity,
                                                           unsigned char* smem) {
  const int N = int(p.state_dim), T = int(p.window), L = int(p.buffer_len), mask = int(p.ring_len) - 1;
  const int rows = d.rows, c = r.committed, warp = threadIdx.x / 32;
  const int64_t tile_end = kTileOffset + tile_bytes(capacity, N, sizeof(S));
  float* weights = reinterpret_cast<float*>(
      smem + tile_end - dot_flush_window_bytes(heads, capacity, N, L - T, sizeof(Act)));  // (heads, kMaxBufferLen)
  float* head_s = weights + heads * kMaxBufferLen;                                       // (heads, 4): decay
  const int B_pitch = int(dot_flush_n_pitch(N, sizeof(Act)));
  Act* B_s = reinterpret_cast<Act*>(head_s + heads * 4);  // (L - T, B_pitch)
  const int x_pitch = int(dot_flush_x_pitch(capacity, sizeof(Act)));
  Act* x_s = B_s + (L - T) * B_pitch;  // (L - T, x_pitch)
  auto position = [&](int j) { return (r.origin + j) & mask; };
  auto stage = [](Act* dst, const Act* src) { copy_pack_async(reinterpret_cast<Pack<Act, 4>*>(dst), src); };

  const Act* B_ring = static_cast<const Act*>(p.B_cache) + slot * p.Bc_stride_slot +
                      d.first_head / int(p.heads_per_group) * p.Bc_stride_group;
  const int n_pieces = N / 4, x_pieces = rows / 4;
  for (int u = threadIdx.x; u < c * n_pieces; u += kThreads) {
    const int j = u / n_pieces, e = (u - j * n_pieces) * 4;
    stage(B_s + j * B_pitch + e, B_ring + position(j) * p.Bc_stride_pos + e);
  }
  const Act* x_ring = static_cast<const Act*>(p.x_cache) + slot * p.xc_stride_slot + d.first;
  for (int u = threadIdx.x; u < c * heads * x_pieces; u += kThreads) {
    const int j = u / (heads * x_pieces), v = u - j * heads * x_pieces, k = v / x_pieces;
    const int e = (v - k * x_pieces) * 4;
    stage(x_s + j * x_pitch + k * rows + e,
          x_ring + (d.first_head + k) * p.xc_stride_head + position(j) * p.xc_stride_pos + e);
  }
  for (int k = warp; k < heads; k += kWarps) {
    const int head = d.first_head + k;
    const float* dt_ring = p.dt_cache + slot * p.dtc_stride_slot + head * p.dtc_stride_head;
    const float bias = head_value(p.dt_bias, head, 0.f), A = head_value(p.A, head, 0.f);  // with the dt
    float dt[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = threadIdx.x % 32 + 32 * h;
      dt[h] = j < c ? effective_dt(__ldg(dt_ring + position(j)), bias, p.dt_softplus) : 0.f;
    }
    window_weights(dt, 0, c - 1, A, weights + k * kMaxBufferLen, head_s + 4 * k);
  }
  return StagedFold<Act>{weights, head_s, B_s, x_s, B_pitch, x_pitch, c};
}

// The split path's first kernel: the dots S0_i . C_t of `rows` head_dim rows from `first` of
// heads_per_cta heads of one group per CTA, for each valid position t of the window, into the
// workspace (batch, T, H, P). A flush row's CTA (a third of the rows at T = 4, L = 16 with every
// draft accepted) folds its committed inputs into its checkpoint rows part_rows tile rows at a
// time and takes the dots of the folded rows (fold_staged_tile; on the tensor cores where
// kTensorFold), or, where part_rows is 0 (the window leaves no room in the tile), returns at once:
// the flush kernel's. kMaxT: T rounded up to 4 or 8 (the sums held in registers).
template <typename S, typename Act, RowLayoutKind kKind, int kMaxT, bool kTensorFold>
__global__ void __launch_bounds__(kThreads, kDotMinCtasPerSm) dot_kernel(const SpecVerifyParams p,
                                                                         int heads_per_cta, int rows, int part_rows) {
  using Ly = Layout<S, kKind>;
  extern __shared__ __align__(128) unsigned char smem[];
  allow_dependent_launch();  // the next kernel's CTAs may start beside this kernel's
  uint64_t* barrier = reinterpret_cast<uint64_t*>(smem);
  const int N = int(p.state_dim), P = int(p.head_dim), H = int(p.nheads), T = int(p.window);
  S* tile = reinterpret_cast<S*>(smem + kTileOffset);  // (heads, rows, N)
  const int capacity = heads_per_cta * rows;  // tile rows (a head's last chunk may have fewer)
  float* C_s = reinterpret_cast<float*>(smem + kTileOffset + tile_bytes(capacity, N, sizeof(S)));  // (T, N)
  const int lane = threadIdx.x % Ly::kLanes, group = threadIdx.x / Ly::kLanes;
  const DotCta d = dot_cta(P, heads_per_cta, rows);
  const int row = d.row, first_head = d.first_head, first = d.first;
  rows = d.rows;
  const int tile_rows = heads_per_cta * rows;
  const int64_t slot = device_slot(p, row);
  if (slot < 0) return;
  const VerifyRow r = verify_row(p, row, slot);
  if (!r.valid || (r.flush && part_rows == 0)) return;
  const int n = r.tokens;
  S* state = static_cast<S*>(p.state) + slot * p.state_stride_slot + first_head * p.state_stride_head +
             first * p.state_stride_p;
  start_heads_tile_load(tile, state, p.state_stride_head, p.state_stride_p, rows, 0,
                        r.flush ? min(part_rows, tile_rows) : tile_rows, N, barrier, L2Hint::kEvictFirst);
  StagedFold<Act> fold{};
  if (r.flush) fold = stage_committed<S, Act>(p, d, slot, r, heads_per_cta, capacity, smem);
  const Act* C = static_cast<const Act*>(p.C) + row * p.C_stride_batch +
                 first_head / int(p.heads_per_group) * p.C_stride_group;
  // A bf16 checkpoint's rows that do not flush take their dots on the tensor cores, with the C_t
  // in registers; every other row from C_t staged widened.
  constexpr bool kTensorDots = kTensorCoreDots<S, Act, Ly>;
  uint32_t columns[Ly::kCoverN / 32][4];
  if constexpr (kTensorDots)
    if (!r.flush) load_dot_columns<Ly::kCoverN>(C, p.C_stride_token, n, columns);
  for (int k = threadIdx.x; k < N && (!kTensorDots || r.flush); k += kThreads) {
    Act v[kMaxT];
#pragma unroll
    for (int t = 0; t < kMaxT; ++t)
      if (t < n) v[t] = load_one(C + t * p.C_stride_token + k);
#pragma unroll
    for (int t = 0; t < kMaxT; ++t)
      if (t < n) C_s[t * N + shared_position<Ly>(k)] = to_float(v[t]);
  }
  if (r.flush) wait_async_copies();
  wait_tile_all<Ly>(barrier);

  // Tile row u of the CTA is row first + u % rows of head first_head + u / rows: the heads are
  // whole when there are several, so its dots sit at u from the first's.
  float* dots = p.workspace + (int64_t(row) * T * H + first_head) * P + first;  // (T, H, P) from here
  auto dots_of = [&](const float (&s)[Ly::kRows][Ly::kVecsPerLane][Ly::kVec], int from, int count, int batch) {
    float y[kMaxT * Ly::kRows];
    window_dots<Ly, kMaxT>(s, C_s, n, lane, N, y);
    store_dots<Ly>(dots + from, int64_t(H) * P, y, n, count, batch, group, lane);
  };
  if (r.flush) {
    if constexpr (kTensorFold) {
      static_assert(kTensorCoreFold<S, Act, Ly>, "the tensor cores fold a 4- or 2-byte state with bf16 inputs");
      fold_staged_tile_on_tensor_cores<Ly, kMaxT>(
          tile, state, p.state_stride_head, p.state_stride_p, rows, tile_rows, part_rows, N, barrier, fold, n,
          [&](int t, int k) { return C_s[t * N + shared_position<Ly>(k)]; },
          [&](int tile_row, const float (&y)[kMaxT]) {
#pragma unroll
            for (int t = 0; t < kMaxT; ++t)
              if (t < n) dots[t * int64_t(H) * P + tile_row] = y[t];
          });
    } else {
      fold_staged_tile<S, Ly>(tile, state, p.state_stride_head, p.state_stride_p, rows, tile_rows, part_rows, N,
                              barrier, fold, [&](const float (&s)[Ly::kRows][Ly::kVecsPerLane][Ly::kVec], int from,
                                                 int next, int batch) { dots_of(s, from, next - from, batch); });
    }
    return;
  }
  if constexpr (kTensorDots) {
    tile_dots_on_tensor_cores<Ly::kCoverN>(tile, tile_rows, columns, [&](int u, int t, float y) {
      if (t < n) dots[t * int64_t(H) * P + u] = y;
    });
    return;
  }
  const int batches = (rows + Ly::kBatchRows - 1) / Ly::kBatchRows;
  for (int k = 0; k < heads_per_cta; ++k) {
    for (int batch = 0; batch < batches; ++batch) {
      float s[Ly::kRows][Ly::kVecsPerLane][Ly::kVec];
#pragma unroll
      for (int q = 0; q < Ly::kRows; ++q)
        tile_row<S, Ly>(tile + k * rows * N, chunk_row<Ly>(batch, q, group), rows, lane, N, s[q]);
      dots_of(s, k * rows, rows, batch);
    }
  }
}

// The split path's third kernel, launched as the flush kernel's programmatic dependent: the window
// work and the outputs of every row, once per (batch row, up to heads_per_cta heads of one group).
// Output t of a row sees the tokens [first, c + t] (first = c on a flush row, whose dots come from
// its folded checkpoint, else 0). Thread u takes kRows consecutive head_dim rows of one head (x,
// cached x, dots and outputs move in packs). Before it waits for the kernels before it, it appends
// the window's x, B and raw dt to the ring and forms, per head and output t, the decay and each
// row's
//   hist_t = sum_{first <= j <= c+t} weight_{j,t} (B_j . C_t) x_j + D x_{c+t},
// then out_t = (decay_t dot_t + hist_t) silu(z_t).
template <typename Act, int kMaxT, int kRows>
__global__ void __launch_bounds__(kWindowThreads, 2) window_kernel(const SpecVerifyParams p, int heads_per_cta) {
  __shared__ float bc[kMaxSpecWindow][kMaxBufferLen];  // B_j . C_t
  __shared__ float decay[kMaxWindowHeads][kMaxSpecWindow], A_s[kMaxWindowHeads], D_s[kMaxWindowHeads];
  static_assert(sizeof(bc) + sizeof(decay) + sizeof(A_s) + sizeof(D_s) == kSpecWindowStaticBytes,
                "the host counts this shared memory");
  extern __shared__ __align__(16) unsigned char window_smem[];  // spec_window_smem
  using Rows = Pack<Act, kRows>;
  const int warps = int(blockDim.x) / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int hpg = int(p.heads_per_group), P = int(p.head_dim), N = int(p.state_dim), H = int(p.nheads);
  const int T = int(p.window), L = int(p.buffer_len), mask = int(p.ring_len) - 1;
  const int chunks = (hpg + heads_per_cta - 1) / heads_per_cta;
  const int g = int(blockIdx.x) / chunks;
  const int first_head = g * hpg + (int(blockIdx.x) % chunks) * heads_per_cta;
  const int heads = min(heads_per_cta, (g + 1) * hpg - first_head);
  const int row = int(blockIdx.y);
  const int64_t slot = device_slot(p, row);
  if (slot < 0) return;
  const VerifyRow r = verify_row(p, row, slot);
  if (!r.valid) return;
  const int c = r.committed, n = r.tokens, count = c + n, first = r.flush ? c : 0;
  auto position = [&](int j) { return (r.origin + j) & mask; };
  const SpecWindowSmem layout = spec_window_smem(blockDim.x, heads_per_cta, T, L, N);
  float* coef = reinterpret_cast<float*>(window_smem) + layout.coef;      // (heads, T, coef_stride)
  float* C_s = reinterpret_cast<float*>(window_smem) + layout.C;          // (T, N)
  float* dt_s = reinterpret_cast<float*>(window_smem) + layout.dt;        // (heads, L)

  // This thread's rows: head k, rows [i, i + kRows); their x of every token from `first` copied
  // into shared memory (kStaged tokens a round, no registers held), in flight with the window's
  // other loads.
  const int per_head = P / kRows;
  const int k = int(threadIdx.x) / per_head, i = (int(threadIdx.x) - k * per_head) * kRows;
  const bool has_rows = k < heads;
  const int h = first_head + k;
  Act* x_ring = static_cast<Act*>(p.x_cache) + slot * p.xc_stride_slot + h * p.xc_stride_head + i;
  const Act* x_window = static_cast<const Act*>(p.x) + row * p.x_stride_batch + h * p.x_stride_head + i;
  constexpr int kStaged = kWindowStagedBytes / int(sizeof(Rows));
  Rows* x_staged = reinterpret_cast<Rows*>(window_smem) + threadIdx.x;  // round token u: [u * blockDim.x]
  auto stage_x = [&](int round_first) {  // the ring's tokens, then the window's (no per-token select)
    const int end = min(count, round_first + kStaged);
    Rows* to = x_staged;
    int j = round_first;
    for (; j < min(c, end); ++j, to += blockDim.x) copy_pack_async(to, x_ring + position(j) * p.xc_stride_pos);
    const Act* from = x_window + (j - c) * p.x_stride_token;
    for (; j < end; ++j, to += blockDim.x, from += p.x_stride_token) copy_pack_async(to, from);
  };
  if (has_rows) stage_x(first);

  // Each head's scalars; the effective dt of the tokens of every head, once for all its outputs
  // (the window's raw dt appended): a warp kDtHeads heads a round, lane l tokens first + l and
  // first + l + 32 of each; the window's C, widened, and its B appended by the group's first head:
  // a thread one element of every position a round. A thread asks for all its values of a round
  // before it stores any (a store right after its load would make each a round trip of its own);
  // no index takes an integer division.
  const Act* C_window = static_cast<const Act*>(p.C) + row * p.C_stride_batch + g * p.C_stride_group;
  const Act* B_window = static_cast<const Act*>(p.B) + row * p.B_stride_batch + g * p.B_stride_group;
  Act* B_ring = static_cast<Act*>(p.B_cache) + slot * p.Bc_stride_slot + g * p.Bc_stride_group;
  const bool appends_B = first_head == g * hpg;
  float A = 0.f, D = 0.f;
  if (int(threadIdx.x) < heads) {
    A = head_value(p.A, first_head + int(threadIdx.x), 0.f);
    D = head_value(p.D, first_head + int(threadIdx.x), 0.f);
  }
  auto ring_dt = [&](int64_t head, int j) {
    return p.dt_cache + slot * p.dtc_stride_slot + head * p.dtc_stride_head + position(j);
  };
  constexpr int kDtHeads = 2;
  const int step = int(blockDim.x);
  for (int k0 = warp, m = threadIdx.x; k0 < heads || m < N; k0 += kDtHeads * warps, m += step) {
    float raw[kDtHeads][2], bias[kDtHeads];
    Act C_e[kMaxT], B_e[kMaxT];
#pragma unroll
    for (int a = 0; a < kDtHeads; ++a) {
      const int kq = k0 + a * warps;
      if (kq >= heads) break;
      const int64_t head = first_head + kq;
      bias[a] = head_value(p.dt_bias, head, 0.f);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = first + lane + 32 * half;
        if (j < count)
          raw[a][half] = j < c ? __ldg(ring_dt(head, j))
                               : widen(load_stored(p.dt, p.dt_dtype,
                                                   row * p.dt_stride_batch + (j - c) * p.dt_stride_token +
                                                       head * p.dt_stride_head));
      }
    }
#pragma unroll
    for (int t = 0; t < kMaxT; ++t) {
      if (m >= N || t >= n) break;
      C_e[t] = load_one(C_window + t * p.C_stride_token + m);
      if (appends_B) B_e[t] = load_one(B_window + t * p.B_stride_token + m);
    }
#pragma unroll
    for (int a = 0; a < kDtHeads; ++a) {
      const int kq = k0 + a * warps;
      if (kq >= heads) break;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = first + lane + 32 * half;
        if (j >= count) continue;
        if (j >= c) *ring_dt(first_head + kq, j) = raw[a][half];
        dt_s[kq * L + j] = effective_dt(raw[a][half], bias[a], p.dt_softplus);
      }
    }
#pragma unroll
    for (int t = 0; t < kMaxT; ++t) {
      if (m >= N || t >= n) break;
      C_s[t * N + m] = to_float(C_e[t]);
      if (appends_B) B_ring[position(c + t) * p.Bc_stride_pos + m] = B_e[t];
    }
  }
  if (int(threadIdx.x) < heads) {
    A_s[threadIdx.x] = A;
    D_s[threadIdx.x] = D;
  }
  // B_j . C_t takes a warp a token (below), each warp asking for its next token's B while it forms
  // the sums of the current one (asked for before the weights, the first B would spill there).
  // Lane l takes the pieces of kPiece elements from n = kPiece (l + 32 v) (B and the B ring are
  // aligned to them on the split path).
  constexpr int kPiece = 4, kPieces = kMaxStateDim / (32 * kPiece);
  using Piece = Pack<Act, kPiece>;
  auto has_piece = [&](int v) { return kPiece * (lane + 32 * v) < N; };
  auto load_B = [&](int j, Piece (&b)[kPieces]) {
    const Act* B_j = j < c ? B_ring + position(j) * p.Bc_stride_pos : B_window + (j - c) * p.B_stride_token;
#pragma unroll
    for (int v = 0; v < kPieces; ++v)
      b[v] = j < count && has_piece(v) ? load_pack<Act, kPiece>(B_j + kPiece * (lane + 32 * v)) : Piece{};
  };
  __syncthreads();

  // The weights of each (head, output t) pair over the tokens [first, c + t], and its decay: for
  // windows of up to 16 (32) tokens two heads (one head) a warp pass, lane 16 s + j (lane j)
  // holding token j of head s for all the head's outputs at once (window_weights_short), else one
  // pair a pass.
  auto weigh_short = [&](auto width) {
    constexpr int kWidth = decltype(width)::value, kHeadsPerPass = 32 / kWidth;
    for (int k0 = kHeadsPerPass * warp; k0 < heads; k0 += kHeadsPerPass * warps) {
      const int kq = k0 + lane / kWidth, j = lane % kWidth;
      const bool has_head = kq < heads;
      const int k_s = has_head ? kq : 0;
      const float dt = j >= first && j < count ? dt_s[k_s * L + j] : 0.f;
      window_weights_short<kWidth, kMaxT>(dt, first, c + 1, n, A_s[k_s],
                                          has_head ? coef + k_s * T * layout.coef_stride : nullptr,
                                          layout.coef_stride, has_head ? decay[k_s] : nullptr);
    }
  };
  if (layout.coef_stride == 16) {
    weigh_short(std::integral_constant<int, 16>{});
  } else if (count <= 32) {
    weigh_short(std::integral_constant<int, 32>{});
  } else {
    const int pairs = heads * n;
    for (int q = warp; q < pairs; q += warps) {
      const int kq = q / n, t = q - kq * n;
      float dt[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = lane + 32 * half;
        dt[half] = j >= first && j < count ? dt_s[kq * L + j] : 0.f;
      }
      window_weights(dt, first, c + t, A_s[kq], coef + (kq * T + t) * layout.coef_stride, &decay[kq][t]);
    }
  }
  // B_j . C_t for every token and output, a warp a token.
  Piece b[kPieces];
  load_B(first + warp, b);
  for (int j = first + warp; j < count; j += warps) {
    Piece next[kPieces];
    load_B(j + warps, next);
    float sums[kMaxT];
#pragma unroll
    for (int t = 0; t < kMaxT; ++t) {
      sums[t] = 0.f;
#pragma unroll
      for (int v = 0; v < kPieces; ++v) {
        if (t >= n || !has_piece(v)) continue;
        float c_t[kPiece], b_v[kPiece];
        load_piece(C_s + t * N + kPiece * (lane + 32 * v), c_t);
        widen_pack(b[v], b_v);
#pragma unroll
        for (int e = 0; e < kPiece; ++e) sums[t] = fmaf(b_v[e], c_t[e], sums[t]);
      }
    }
    transposed_sums<32, kMaxT>(sums, lane);
    const int t = held_value<32, kMaxT>(lane, 0);
    if (lane % (32 / kMaxT) == 0 && t < n) bc[t][j] = sums[0];
#pragma unroll
    for (int v = 0; v < kPieces; ++v) b[v] = next[v];
  }
  __syncthreads();
  // The history coefficients weight_{j,t} (B_j . C_t), with D added on each output's own token:
  // kPairThreads threads a (head, output) pair, pairs indexed by kMaxT outputs a head and tokens
  // strided, so that no index takes an integer division.
  constexpr int kPairThreads = 4;
  for (int u = threadIdx.x; u < heads * kMaxT * kPairThreads; u += blockDim.x) {
    const int kq = u / (kMaxT * kPairThreads), t = u / kPairThreads % kMaxT;
    if (t >= n) continue;
    float* a = coef + (kq * T + t) * layout.coef_stride;
    for (int j = first + u % kPairThreads; j < count; j += kPairThreads)
      a[j] = a[j] * bc[t][j] + (j == c + t ? D_s[kq] : 0.f);
  }
  __syncthreads();

  // The history sums, token by token (the window's x appended to the ring on the way), then the
  // gates silu(z_t), formed before the wait so that after it only the outputs' products are left.
  // They are kept in this thread's staged-x slot: gate q of output t is float t kRows + q of it,
  // kPerToken floats a staged token.
  constexpr int kPerToken = int(sizeof(Rows)) / 4;
  static_assert(kMaxT * kRows <= kStaged * kPerToken, "the gates fit the slot");
  using Gates = Pack<float, kPerToken>;
  auto gates = [&](int f) { return reinterpret_cast<Gates*>(x_staged + f / kPerToken * blockDim.x); };
  float hist[kMaxT][kRows];
#pragma unroll
  for (int t = 0; t < kMaxT; ++t) {
#pragma unroll
    for (int q = 0; q < kRows; ++q) hist[t][q] = 0.f;
  }
  if (has_rows) {
    // The outputs' z, kGateTokens at a time (more would spill under the register cap with the
    // sums); with 2-byte activations and up to kGateTokens outputs they are asked for before the
    // sums (wider ones would spill there).
    constexpr int kGateTokens = 4;
    constexpr bool kEarlyZ = sizeof(Act) == 2 && kMaxT <= kGateTokens;
    auto load_z = [&](int t0, Rows (&z)[kGateTokens]) {  // only where the call has z
      const Act* z_rows = static_cast<const Act*>(p.z) + row * p.z_stride_batch + h * p.z_stride_head + i;
#pragma unroll
      for (int u = 0; u < kGateTokens; ++u)
        if (t0 + u < n) z[u] = load_pack<Act, kRows>(z_rows + (t0 + u) * p.z_stride_token);
    };
    Rows z[kGateTokens];
    if (kEarlyZ && p.z) load_z(0, z);
    const float* coef_k = coef + k * T * layout.coef_stride;
    for (int round_first = first; round_first < count; round_first += kStaged) {
      if (round_first > first) stage_x(round_first);  // a longer window: the next round of tokens
      wait_async_copies();
#pragma unroll
      for (int u = 0; u < kStaged; ++u) {
        const int j = round_first + u;
        if (j >= count) break;
        const Rows x_j = x_staged[u * blockDim.x];
        float xf[kRows];
        widen_pack(x_j, xf);
#pragma unroll
        for (int t = 0; t < kMaxT; ++t) {
          if (t >= n) break;
          const float a = coef_k[t * layout.coef_stride + j];
#pragma unroll
          for (int q = 0; q < kRows; ++q) hist[t][q] = fmaf(a, xf[q], hist[t][q]);
        }
        if (j >= c) store_pack(x_ring + position(j) * p.xc_stride_pos, x_j);
      }
    }
#pragma unroll
    for (int t0 = 0; t0 < kMaxT; t0 += kGateTokens) {
      if (!p.z || t0 >= n) break;
      if (!kEarlyZ || t0 > 0) load_z(t0, z);
#pragma unroll
      for (int f0 = 0; f0 < kGateTokens * kRows; f0 += kPerToken) {
        if (t0 + f0 / kRows >= n) break;
        Gates g;
#pragma unroll
        for (int e = 0; e < kPerToken; ++e) g.v[e] = silu(to_float(z[(f0 + e) / kRows].v[(f0 + e) % kRows]));
        *gates(t0 * kRows + f0) = g;
      }
    }
  }

  // The outputs, from the dots of the dot and flush kernels.
  wait_for_prior_kernel();
  if (!has_rows) return;
#pragma unroll
  for (int t = 0; t < kMaxT; ++t) {
    if (t >= n) break;
    float dot[kRows], gate[kRows];
    load_piece(p.workspace + ((int64_t(row) * T + t) * H + h) * P + i, dot);
#pragma unroll
    for (int f0 = 0; f0 < kRows; f0 += kPerToken) {
      const Gates g = p.z ? *gates(t * kRows + f0) : Gates{};
#pragma unroll
      for (int e = 0; e < kPerToken; ++e) gate[f0 + e] = g.v[e];
    }
    Rows out;
#pragma unroll
    for (int q = 0; q < kRows; ++q) {
      const float v = fmaf(decay[k][t], dot[q], hist[t][q]);
      out.v[q] = from_float<Act>(p.z ? v * gate[q] : v);
    }
    store_pack(static_cast<Act*>(p.out) + row * p.out_stride_batch + t * p.out_stride_token + h * p.out_stride_head + i,
               out);
  }
}

// The baseline: token by token from the previous window's accepted state, the state after each
// position stored in its slot: S = exp(A dt) S + dt x B^T, y = S C. The state stays in registers
// across the positions (each store is the rounded copy of it). kMaxT: T rounded up to 4 or 8.
template <typename S, typename Act, RowLayoutKind kKind, int kMaxT>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm<S>) baseline_kernel(const SpecBaselineParams p,
                                                                           int rows_per_cta) {
  using Ly = Layout<S, kKind>;
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* barrier = reinterpret_cast<uint64_t*>(smem);
  const int64_t N = p.state_dim;
  const int T = int(p.window);
  const SpecBaselineSmem layout = spec_baseline_smem(rows_per_cta, N, T);
  S* tile = reinterpret_cast<S*>(smem + kTileOffset);  // (rows, N)
  float* floats = reinterpret_cast<float*>(smem + kTileOffset + tile_bytes(rows_per_cta, N, sizeof(S)));
  float* B_s = floats + layout.B;
  float* C_s = floats + layout.C;
  float* xdt_s = floats + layout.xdt;
  float* Dx_s = floats + layout.Dx;
  float* z_s = floats + layout.z;
  float* decay_s = floats + layout.decay;
  const int lane = threadIdx.x % Ly::kLanes, group = threadIdx.x / Ly::kLanes;
  const CtaWork w = cta_work(p, rows_per_cta);
  // This step's inputs need none of the row's slots or counts: every token of the call's window
  // asked for first, kept as stored, so that they do not queue behind the tile's copy.
  const int g = w.group;
  constexpr int kPerThread = (kMaxStateDim + kThreads - 1) / kThreads;
  Act b[kPerThread][kMaxT], c[kPerThread][kMaxT];
#pragma unroll
  for (int q = 0; q < kPerThread; ++q) {
    const int k = threadIdx.x + q * kThreads;
#pragma unroll
    for (int t = 0; t < kMaxT; ++t) {
      if (k >= N || t >= T) continue;
      b[q][t] = load_one(token<Act>(p.B, w.row * p.B_stride_batch + g * p.B_stride_group + k, t, p.B_stride_token));
      c[q][t] = load_one(token<Act>(p.C, w.row * p.C_stride_batch + g * p.C_stride_group + k, t, p.C_stride_token));
    }
  }
  const bool has_row = int(threadIdx.x) < w.rows;  // chunk row threadIdx.x
  float raw_dt[kMaxT];
  Act x[kMaxT], z[kMaxT];
#pragma unroll
  for (int t = 0; t < kMaxT; ++t) {
    if (!has_row || t >= T) continue;
    const int64_t i = w.first + threadIdx.x;
    raw_dt[t] = widen(load_stored(p.dt, p.dt_dtype, w.row * p.dt_stride_batch + t * p.dt_stride_token + w.head * p.dt_stride_head));
    x[t] = load_one(token<Act>(p.x, w.row * p.x_stride_batch + w.head * p.x_stride_head + i, t, p.x_stride_token));
    if (p.z) z[t] = load_one(token<Act>(p.z, w.row * p.z_stride_batch + w.head * p.z_stride_head + i, t, p.z_stride_token));
  }
  if (device_slot(p, w.row) < 0) return;
  const int n = p.num_valid_tokens ? load_one(p.num_valid_tokens + w.row * p.num_valid_tokens_stride) : T;
  const int accepted = load_one(p.num_accepted_tokens + w.row * p.num_accepted_tokens_stride);
  if (n < 1 || n > T || accepted < 1 || accepted > T) return;
  auto valid_slot = [&](int64_t s) { return s >= 0 && s < p.slots; };
  const int64_t source = baseline_slot(p, w.row, accepted - 1);
  if (!valid_slot(source)) return;
  const int64_t head_offset = w.head * p.state_stride_head + w.first * p.state_stride_p;
  start_tile_load<S, Ly>(tile, static_cast<const S*>(p.state) + source * p.state_stride_slot + head_offset,
                         p.state_stride_p, w.rows, N, barrier, L2Hint::kNormal, TileBarrier::kSetUp);
  S* states[kMaxT];  // the chunk's rows in each position's slot
  bool slots_valid = true;
#pragma unroll
  for (int t = 0; t < kMaxT; ++t) {
    const int64_t slot = t < n ? baseline_slot(p, w.row, t) : 0;
    slots_valid = slots_valid && valid_slot(slot);
    states[t] = static_cast<S*>(p.state) + slot * p.state_stride_slot + head_offset;
  }
  if (!slots_valid) {
    wait_tile<Ly>(barrier);
    return;
  }

#pragma unroll
  for (int q = 0; q < kPerThread; ++q) {
    const int k = threadIdx.x + q * kThreads;
#pragma unroll
    for (int t = 0; t < kMaxT; ++t) {
      if (k >= N || t >= n) continue;
      B_s[t * N + shared_position<Ly>(k)] = to_float(b[q][t]);
      C_s[t * N + shared_position<Ly>(k)] = to_float(c[q][t]);
    }
  }
  const float A = head_value(p.A, w.head, 0.f), bias = head_value(p.dt_bias, w.head, 0.f);
  const float D = head_value(p.D, w.head, 0.f);
  if (has_row) {
    const int i = threadIdx.x;
#pragma unroll
    for (int t = 0; t < kMaxT; ++t) {
      if (t >= n) continue;
      const float dt = effective_dt(raw_dt[t], bias, p.dt_softplus);
      xdt_s[t * rows_per_cta + i] = dt * to_float(x[t]);
      Dx_s[t * rows_per_cta + i] = D * to_float(x[t]);
      if (p.z) z_s[t * rows_per_cta + i] = to_float(z[t]);
      if (i == 0) decay_s[t] = expf(A * dt);
    }
  }
  wait_tile_all<Ly>(barrier);

  const int batches = (w.rows + Ly::kBatchRows - 1) / Ly::kBatchRows;
  for (int batch = 0; batch < batches; ++batch) {
    float s[Ly::kRows][Ly::kVecsPerLane][Ly::kVec];
#pragma unroll
    for (int k = 0; k < Ly::kRows; ++k) tile_row<S, Ly>(tile, chunk_row<Ly>(batch, k, group), w.rows, lane, N, s[k]);
    float y[kMaxT * Ly::kRows];
#pragma unroll
    for (int t = 0; t < kMaxT; ++t) {
#pragma unroll
      for (int k = 0; k < Ly::kRows; ++k) y[t * Ly::kRows + k] = 0.f;
      if (t >= n) continue;
      float b[Ly::kVecsPerLane][Ly::kVec], c_t[Ly::kVecsPerLane][Ly::kVec];
      shared_slice<Ly>(B_s + t * N, lane, N, b);
      shared_slice<Ly>(C_s + t * N, lane, N, c_t);
#pragma unroll
      for (int k = 0; k < Ly::kRows; ++k) {
        const int i = chunk_row<Ly>(batch, k, group);
        state_step<Ly>(s[k], decay_s[t], i < w.rows ? xdt_s[t * rows_per_cta + i] : 0.f, b);
        if (i < w.rows) store_row<S, Ly>(states[t] + i * p.state_stride_p, s[k], lane, N);
        y[t * Ly::kRows + k] = slice_dot<Ly>(s[k], c_t);
      }
    }
    store_window_outputs<Ly, Act>(p, w, y, n, batch, group, lane, rows_per_cta, nullptr, Dx_s,
                                  p.z ? z_s : nullptr);
  }
}

// Every kernel holds its per-output sums in registers for kMaxT outputs: windows of up to
// kShortWindow tokens take the kShortWindow instantiations, longer ones kMaxSpecWindow's.
constexpr int kShortWindow = 4;
inline bool short_window(const WindowParams& p) { return p.window <= kShortWindow; }

// (head, chunk) along x, batch rows along y, as in standard decode.
inline dim3 spec_grid(const WindowParams& p, int rows_per_cta) {
  const int64_t chunks = (p.head_dim + rows_per_cta - 1) / rows_per_cta;
  return dim3(unsigned(p.nheads * chunks), unsigned(p.batch));
}

// Calls f with the layout as a compile-time constant.
template <typename F> void with_layout(RowLayoutKind layout, F f) {
  switch (layout) {
    case RowLayoutKind::kN64: return f(std::integral_constant<RowLayoutKind, RowLayoutKind::kN64>{});
    case RowLayoutKind::kN128: return f(std::integral_constant<RowLayoutKind, RowLayoutKind::kN128>{});
    case RowLayoutKind::kN256: return f(std::integral_constant<RowLayoutKind, RowLayoutKind::kN256>{});
    case RowLayoutKind::kGeneric: return f(std::integral_constant<RowLayoutKind, RowLayoutKind::kGeneric>{});
  }
}

template <typename Kernel, typename Params, typename... Extra>
void launch(Kernel kernel, const Params& p, int rows_per_cta, int64_t smem, cudaStream_t stream,
            Extra... extra) {
  allow_smem(kernel, smem);
  kernel<<<spec_grid(p, rows_per_cta), kThreads, size_t(smem), stream>>>(p, rows_per_cta, extra...);
  REPLAYSSM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace replayssm::cuda::spec

namespace replayssm::cuda {

template <typename S, typename Act>
void launch_spec_verify(const SpecVerifyParams& p, RowLayoutKind layout, int rows_per_cta, bool x_slices,
                        cudaStream_t stream) {
  spec::with_layout(layout, [&](auto kind) {
    constexpr RowLayoutKind k = decltype(kind)::value;
    spec::launch(spec::short_window(p) ? spec::verify_kernel<S, Act, k, spec::kShortWindow>
                                       : spec::verify_kernel<S, Act, k, kMaxSpecWindow>,
                 p, rows_per_cta, spec_verify_smem_bytes(p, layout, rows_per_cta), stream, x_slices);
  });
}

template <typename S, typename Act>
void launch_spec_split(const SpecVerifyParams& p, RowLayoutKind layout, int flush_rows_per_cta, bool x_slices,
                       cudaStream_t stream) {
  const RowLayout shape = make_row_layout(int(sizeof(S)), layout);
  cudaLaunchAttribute after_previous;
  after_previous.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  after_previous.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.stream = stream;
  const bool short_window = spec::short_window(p);

  // The dot kernel folds the flush rows where their committed inputs (at most L - T tokens) leave
  // room for a part of the tile (spec_dot_flush_part_rows); otherwise the flush kernel takes them.
  const DotShape dot = dot_shape(p, sizeof(S), shape);
  const int part_rows = spec_dot_flush_part_rows(p, dot, shape);
  config.gridDim = dim3(unsigned(dot_ctas_per_row(p, dot)), unsigned(p.batch));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = size_t(spec_dot_smem_bytes(p, dot.heads, dot.rows));
  spec::with_layout(layout, [&](auto kind) {
    constexpr RowLayoutKind k = decltype(kind)::value;
    if constexpr (k != RowLayoutKind::kGeneric) {
      auto kernel = short_window ? spec::dot_kernel<S, Act, k, spec::kShortWindow, false>
                                 : spec::dot_kernel<S, Act, k, kMaxSpecWindow, false>;
      if constexpr (kTensorCoreFold<S, Act, Layout<S, k>>) {
        if (p.buffer_len - p.window > kTensorFoldMinTokens)  // the most committed tokens a flush folds
          kernel = short_window ? spec::dot_kernel<S, Act, k, spec::kShortWindow, true>
                                : spec::dot_kernel<S, Act, k, kMaxSpecWindow, true>;
      }
      allow_smem(kernel, int64_t(config.dynamicSmemBytes));
      REPLAYSSM_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p, dot.heads, dot.rows, part_rows));
    }
  });
  config.attrs = &after_previous;
  config.numAttrs = 1;

  // Flush rows are at most one in (L - 2T) / T + 1 when every row commits T tokens a step and rows
  // are desynchronised (fewer with fewer accepted): the flush grid has up to that share of the
  // batch's CTAs per (head, chunk), each looping over its share of the flush rows.
  if (part_rows == 0) {
    const int64_t cycle = (p.buffer_len - 2 * p.window) / p.window + 1;
    const int64_t chunks = spec::spec_grid(p, flush_rows_per_cta).x;
    const int64_t flush_rows = std::min(p.batch, (p.batch + cycle - 1) / cycle);
    config.gridDim =
        dim3(unsigned(chunks), unsigned(flush_ctas_per_chunk(spec::kFlushMinCtasPerSm, chunks, flush_rows)));
    config.dynamicSmemBytes = size_t(spec_verify_smem_bytes(p, layout, flush_rows_per_cta));
    spec::with_layout(layout, [&](auto kind) {
      if constexpr (decltype(kind)::value != RowLayoutKind::kGeneric) {
        const auto kernel = short_window ? spec::flush_kernel<S, Act, decltype(kind)::value, spec::kShortWindow>
                                         : spec::flush_kernel<S, Act, decltype(kind)::value, kMaxSpecWindow>;
        allow_smem(kernel, int64_t(config.dynamicSmemBytes), kFlushStaticBytes);
        REPLAYSSM_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p, flush_rows_per_cta, x_slices));
      }
    });
  }

  auto ctas_a_row = [&](int heads) { return p.ngroups * ((p.heads_per_group + heads - 1) / heads); };
  auto fits = [&](int heads) { return p.batch * ctas_a_row(heads) <= kSpecWindowFewCtasPerSm * sm_count(); };
  const int few_heads = window_heads(p.heads_per_group, p.head_dim, kSpecWindowRowsFew);
  const bool few = few_heads > 0 && fits(few_heads);
  const int rows = few ? kSpecWindowRowsFew : kSpecWindowRowsMany;
  int heads = few ? few_heads : window_heads(p.heads_per_group, p.head_dim, rows);
  while (few && heads > 1 && window_threads((heads + 1) / 2, p.head_dim, rows) >= kSpecWindowFewMinThreads &&
         fits((heads + 1) / 2))
    heads = (heads + 1) / 2;
  const int64_t threads = window_threads(heads, p.head_dim, rows);
  config.gridDim = dim3(unsigned(ctas_a_row(heads)), unsigned(p.batch));
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = size_t(spec_window_smem(threads, heads, p.window, p.buffer_len, p.state_dim).bytes);
  const auto window_kernel =
      short_window ? (few ? spec::window_kernel<Act, spec::kShortWindow, kSpecWindowRowsFew>
                          : spec::window_kernel<Act, spec::kShortWindow, kSpecWindowRowsMany>)
                   : (few ? spec::window_kernel<Act, kMaxSpecWindow, kSpecWindowRowsFew>
                          : spec::window_kernel<Act, kMaxSpecWindow, kSpecWindowRowsMany>);
  allow_smem(window_kernel, int64_t(config.dynamicSmemBytes), kSpecWindowStaticBytes);
  REPLAYSSM_CUDA_CHECK(cudaLaunchKernelEx(&config, window_kernel, p, heads));
}

template <typename S, typename Act>
void launch_spec_baseline(const SpecBaselineParams& p, RowLayoutKind layout, int rows_per_cta,
                          cudaStream_t stream) {
  spec::with_layout(layout, [&](auto kind) {
    constexpr RowLayoutKind k = decltype(kind)::value;
    spec::launch(spec::short_window(p) ? spec::baseline_kernel<S, Act, k, spec::kShortWindow>
                                       : spec::baseline_kernel<S, Act, k, kMaxSpecWindow>,
                 p, rows_per_cta, spec_baseline_smem_bytes(p, layout, rows_per_cta), stream);
  });
}

}  // namespace replayssm::cuda

// Explicit instantiations of the launchers for state type S and every activation type.
#define REPLAYSSM_INSTANTIATE_SPEC_LAUNCHER(S, Act)                                                         \
  template void replayssm::cuda::launch_spec_verify<S, Act>(                                                \
      const replayssm::SpecVerifyParams&, replayssm::cuda::RowLayoutKind, int, bool, cudaStream_t);         \
  template void replayssm::cuda::launch_spec_split<S, Act>(                                                 \
      const replayssm::SpecVerifyParams&, replayssm::cuda::RowLayoutKind, int, bool, cudaStream_t);         \
  template void replayssm::cuda::launch_spec_baseline<S, Act>(                                              \
      const replayssm::SpecBaselineParams&, replayssm::cuda::RowLayoutKind, int, cudaStream_t);
#define REPLAYSSM_INSTANTIATE_SPEC_LAUNCHERS(S)           \
  REPLAYSSM_INSTANTIATE_SPEC_LAUNCHER(S, float)           \
  REPLAYSSM_INSTANTIATE_SPEC_LAUNCHER(S, replayssm::Half) \
  REPLAYSSM_INSTANTIATE_SPEC_LAUNCHER(S, replayssm::BFloat16)
