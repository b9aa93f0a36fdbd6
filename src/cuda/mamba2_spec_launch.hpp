// Typed launchers of the speculative kernels, one explicit instantiation set per state dtype
// (mamba2_spec_*.cu) so that the kernels compile in parallel, and their shared memory layouts.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "api/spec_params.hpp"
#include "cuda/launch_shape.hpp"
#include "cuda/row_layout.hpp"

namespace replayssm::cuda {

// Shared memory of a speculative CTA, as in standard decode (row_layout.hpp): an mbarrier, the
// chunk's state tile (rows_per_cta x state_dim elements of the state type), then the floats listed
// here, at offsets counted from the end of the tile. N = state_dim, T = window, L = buffer_len.
// Above the default 48 KiB (a whole fp32 head at L = 16 takes about 51 KiB): four CTAs an SM still
// fit, as many as the registers allow.
constexpr int64_t kSpecMaxSharedBytes = 72 * 1024;

struct SpecVerifySmem {
  int64_t coef = 0;   // (kMaxSpecWindow, kMaxBufferLen): weight_{j,t}, then weight_{j,t} (B_j . C_t)
  int64_t fold = 0;   // (kMaxBufferLen): the weights of the committed inputs a flush folds
  int64_t decay = 0;  // (kMaxSpecWindow + 1): decay of each output, then the fold's
  int64_t B = 0;      // (L, N): B of every token, widened
  int64_t C = 0;      // (T, N): the window's C, widened
  int64_t z = 0;      // (T, rows_per_cta)
  int64_t hist = 0;   // (T, rows_per_cta): sum_j weight_{j,t} (B_j . C_t) x_j + D x_t
  int64_t x = 0;      // (L, pitch): x of every token, this chunk's rows
  int64_t floats = 0;
};
constexpr SpecVerifySmem spec_verify_smem(int64_t rows_per_cta, int64_t N, int64_t T, int64_t L,
                                          int64_t lanes) {
  SpecVerifySmem s;
  s.fold = s.coef + kMaxSpecWindow * kMaxBufferLen;
  s.decay = s.fold + kMaxBufferLen;
  s.B = s.decay + kMaxSpecWindow + 4;  // 16-byte aligned rows
  s.C = s.B + L * N;
  s.z = s.C + T * N;
  s.hist = s.z + T * rows_per_cta;
  s.x = s.hist + T * rows_per_cta;
  s.floats = s.x + L * window_pitch(rows_per_cta, lanes);
  return s;
}

struct SpecBaselineSmem {
  int64_t B = 0;      // (T, N), widened
  int64_t C = 0;      // (T, N)
  int64_t xdt = 0;    // (T, rows_per_cta): dt_t x_t
  int64_t Dx = 0;     // (T, rows_per_cta): D x_t
  int64_t z = 0;      // (T, rows_per_cta)
  int64_t decay = 0;  // (kMaxSpecWindow): exp(A dt_t)
  int64_t floats = 0;
};
constexpr SpecBaselineSmem spec_baseline_smem(int64_t rows_per_cta, int64_t N, int64_t T) {
  SpecBaselineSmem s;
  s.C = s.B + T * N;
  s.xdt = s.C + T * N;
  s.Dx = s.xdt + T * rows_per_cta;
  s.z = s.Dx + T * rows_per_cta;
  s.decay = s.z + T * rows_per_cta;
  s.floats = s.decay + kMaxSpecWindow;
  return s;
}

inline int64_t spec_verify_smem_bytes(const SpecVerifyParams& p, RowLayoutKind kind, int64_t rows_per_cta) {
  const RowLayout l = make_row_layout(int(dtype_size(p.state_dtype)), kind);
  return kTileOffset + tile_bytes(rows_per_cta, p.state_dim, dtype_size(p.state_dtype)) +
         spec_verify_smem(rows_per_cta, p.state_dim, p.window, p.buffer_len, l.lanes).floats * 4;
}
inline int64_t spec_baseline_smem_bytes(const SpecBaselineParams& p, RowLayoutKind, int64_t rows_per_cta) {
  return kTileOffset + tile_bytes(rows_per_cta, p.state_dim, dtype_size(p.state_dtype)) +
         spec_baseline_smem(rows_per_cta, p.state_dim, p.window).floats * 4;
}

// The split path's dot kernel: the tile of dot_shape (launch_shape.hpp), then the window's C
// widened (T x N floats).
inline int64_t spec_dot_smem_bytes(const SpecVerifyParams& p, int heads, int rows) {
  return kTileOffset + tile_bytes(heads * rows, p.state_dim, dtype_size(p.state_dtype)) +
         p.window * p.state_dim * 4;
}

// Tile rows a flush row's CTA of the split path's dot kernel folds at a time (dot_flush_part_rows,
// with the at most L - T committed tokens of a flush row staged), or 0 where they leave no room:
// the flush kernel then takes the flush rows.
inline int spec_dot_flush_part_rows(const SpecVerifyParams& p, const DotShape& dot, const RowLayout& layout) {
  return int(dot_flush_part_rows(dot.heads, dot.rows, p.state_dim, dtype_size(p.state_dtype),
                                 p.buffer_len - p.window, dtype_size(p.act_dtype), layout.batch_rows));
}

// The split path's window kernel: each thread takes kSpecWindowRowsMany head_dim rows of one head,
// or kSpecWindowRowsFew where the grid of such CTAs (twice the threads a window, each with about
// half the chain) is at most kSpecWindowFewCtasPerSm an SM: there each CTA's chain is the step's
// tail (two an SM were slower with a bf16 state at batch 32: notes/spec.md, v61). Such a grid
// takes half the heads a CTA while it still fits and each CTA keeps kSpecWindowFewMinThreads
// threads: more SMs share the work, and fewer warps would lengthen each warp's share of the
// B_j . C_t tokens (notes/spec.md, v62). Its shared memory holds each thread's staged x
// (kWindowStagedBytes), then floats: each head's coefficients of each output (heads x T x
// coef_stride: 16 for L <= 16, the tokens window_weights_short<16> covers, else 64), the window's
// C (T x N) and each head's effective dt of every token (heads x L).
constexpr int kSpecWindowRowsMany = 4, kSpecWindowRowsFew = 2, kSpecWindowFewCtasPerSm = 1;
constexpr int kSpecWindowFewMinThreads = 256;
// Its static shared memory: B_j . C_t of every token and output, each head's decays and scalars.
constexpr int64_t kSpecWindowStaticBytes = (kMaxSpecWindow * kMaxBufferLen + kMaxWindowHeads * (kMaxSpecWindow + 2)) * 4;
struct SpecWindowSmem {
  int coef_stride = 0;
  int64_t coef = 0, C = 0, dt = 0;  // floats
  int64_t bytes = 0;
};
constexpr SpecWindowSmem spec_window_smem(int64_t threads, int64_t heads, int64_t T, int64_t L, int64_t N) {
  SpecWindowSmem s;
  s.coef_stride = L <= 16 ? 16 : int(kMaxBufferLen);
  s.coef = threads * kWindowStagedBytes / 4;
  s.C = s.coef + heads * T * s.coef_stride;
  s.dt = s.C + T * N;
  s.bytes = (s.dt + heads * L) * 4;
  return s;
}

// x_slices: every x row of the window and of the ring, and every chunk of rows_per_cta rows, is
// 16-byte aligned (x is staged by 16-byte accesses).
template <typename S, typename Act>
void launch_spec_verify(const SpecVerifyParams& p, RowLayoutKind layout, int rows_per_cta, bool x_slices,
                        cudaStream_t stream);
// The split path (a workspace in p, a vectorised layout): the dot, flush and window kernels;
// flush_rows_per_cta for the flush kernel, x_slices as for launch_spec_verify at that size.
template <typename S, typename Act>
void launch_spec_split(const SpecVerifyParams& p, RowLayoutKind layout, int flush_rows_per_cta, bool x_slices,
                       cudaStream_t stream);
template <typename S, typename Act>
void launch_spec_baseline(const SpecBaselineParams& p, RowLayoutKind layout, int rows_per_cta,
                          cudaStream_t stream);

}  // namespace replayssm::cuda
