// The shape of a launch of the decode-style kernels (standard decode and speculative decoding):
// the row layout of the state and the head_dim rows per CTA. Host code.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>

#include "api/params.hpp"
#include "cuda/check.hpp"
#include "cuda/row_layout.hpp"

namespace replayssm::cuda {

// Multiprocessors of the current device (cached per device).
int sm_count();
// Shared memory (bytes) each of ctas_per_sm CTAs an SM can take on the current device: the SM's
// shared memory shared out, less what the driver reserves for each CTA (cached per device).
int64_t shared_bytes_per_cta(int ctas_per_sm);
// The most shared memory (bytes, static and dynamic) one CTA can opt in to on the current device
// (cached per device).
int64_t max_shared_bytes_per_cta();

// True when `ptr` and every stride (in elements of `element_bytes`) keep `alignment`-byte accesses
// aligned.
bool aligned(const void* ptr, int64_t element_bytes, int64_t alignment,
             std::initializer_list<int64_t> strides);

// The layout state_dim calls for (InvalidArgument past kMaxStateDim); kGeneric unless the state
// and B and C (batch and group strides) keep its 16-byte state accesses and its B, C slice
// accesses (slice_access_bytes) aligned. Callers check their further tensors the same way.
RowLayoutKind vectorised_layout(const Mamba2Params& p);
int64_t slice_access_bytes(const Mamba2Params& p, RowLayoutKind kind);

// head_dim rows per CTA: a multiple of the layout's batch of rows, at most `requested` when it
// is > 0, whose shared memory (smem_bytes(rows)) fits smem_limit; without a request, chunks
// shrink until the grid has target_ctas_per_sm CTAs per SM. InvalidArgument when the grid would
// exceed CUDA's limits or the smallest chunk does not fit.
int rows_per_cta_for(const Mamba2Params& p, RowLayoutKind kind, int64_t requested,
                     int64_t target_ctas_per_sm, int64_t smem_limit,
                     const std::function<int64_t(int64_t)>& smem_bytes);

// head_dim rows a thread of the split path's window kernel takes (row_layout.hpp): kWindowRowsMany
// where head_dim allows it and the grid has kWindowRowsManyCtasPerSm window CTAs per SM, else
// kWindowRowsFew.
int window_rows_per_thread(const ReplayParams& p);

// Whether the split path's window kernel, a grid of `ctas` CTAs of `threads` threads of `rows` rows
// each, takes its window in one round (kOneRound): where the grid has at most
// kWindowOneRoundCtasPerSm CTAs an SM, so that they all start beside the dot kernel's last CTAs and
// their chain is the step's tail, where no flush kernel follows (part_rows > 0), and where that many
// CTAs with the round's shared memory fit an SM. At four and eight CTAs an SM (Nemotron-H batch 64
// and 128) and beside the flush kernel the one round was up to 6% slower (H100, notes/cuda.md, v69).
constexpr int64_t kWindowOneRoundCtasPerSm = 2;
bool window_one_round(const ReplayParams& p, int64_t ctas, int64_t threads, int rows, int part_rows);

// CTAs of a grid of (row, head, chunk of rows_per_cta rows).
int64_t ctas_for(const Mamba2Params& p, int64_t rows_per_cta);

// The shape of the split paths' dot kernels (standard decode and speculative verify): whole
// heads, as many of one group as keep the tile within kDotTileBytes, or chunks of a head
// (multiples of the layout's batch of rows) where one head is larger. Six such CTAs an SM keep
// about 192 KiB of checkpoint in flight, what a read-only stream needs to run at the copy
// bandwidth on an H200 (notes/cuda.md, v11).
constexpr int64_t kDotTileBytes = 32 * 1024;
struct DotShape {
  int heads, rows;
};
inline DotShape dot_shape(const Mamba2Params& p, int64_t state_bytes, const RowLayout& layout) {
  const int64_t row_bytes = p.state_dim * state_bytes;
  if (p.head_dim * row_bytes > kDotTileBytes) {
    const int64_t rows = kDotTileBytes / row_bytes / layout.batch_rows * layout.batch_rows;
    return {1, int(rows > layout.batch_rows ? rows : layout.batch_rows)};
  }
  int64_t heads = 1;
  while (p.heads_per_group % (2 * heads) == 0 && 2 * heads * p.head_dim * row_bytes <= kDotTileBytes)
    heads *= 2;
  return {int(heads), int(p.head_dim)};
}
// CTAs of a dot kernel per batch row (blocks of heads x chunks of rows: dot_cta).
inline int64_t dot_ctas_per_row(const Mamba2Params& p, const DotShape& dot) {
  return p.nheads / dot.heads * ((p.head_dim + dot.rows - 1) / dot.rows);
}

// Tile rows a flush row's CTA of the standard-decode dot kernel folds at a time (flush_heads), or 0
// where the flush kernel takes the flush rows instead. Folding them in the dot kernel was measured
// faster for a 4-byte state at every batch, for a 2-byte state (twice the values a tile to fold)
// from kDotFlushMinCtasPerSm dot CTAs an SM, and slower for 8-bit checkpoints (four times), whose
// long folds then hold their tiles' shared memory (notes/cuda.md, v17).
constexpr int64_t kDotFlushMinCtasPerSm = 24;
inline int dot_flush_part_rows_for(const ReplayParams& p, int64_t state_bytes, const DotShape& dot,
                                   const RowLayout& layout) {
  const int64_t ctas = dot_ctas_per_row(p, dot) * p.batch;
  const bool in_dot = state_bytes == 4 || (state_bytes == 2 && ctas >= kDotFlushMinCtasPerSm * sm_count());
  return in_dot ? int(dot_flush_part_rows(dot.heads, dot.rows, p.state_dim, state_bytes, p.buffer_len + 1,
                                          dtype_size(p.act_dtype), layout.batch_rows))
                : 0;
}

// The tile of the dot kernel as a call's one kernel: a head's rows (or a chunk of them), never
// more heads, so that a small batch has a CTA for each head and a CTA's window is one head's.
inline DotShape one_kernel_dot_shape(const Mamba2Params& p, int64_t state_bytes, const RowLayout& layout) {
  const DotShape dot = dot_shape(p, state_bytes, layout);
  return dot.heads == 1 ? dot : DotShape{1, int(p.head_dim)};
}

// The shared memory of the dot kernel as a call's one kernel, and the tile rows its flush rows'
// CTAs fold at a time (part_rows; 0 where not even one batch of rows fits). A flush row's window
// is staged at the end of the CTA's shared memory, past its first tile part, and the CTA may take
// more than its tile and window sums (dot_window_smem_bytes), up to the share of the SM that
// kMinCtasPerSm CTAs leave each (their registers allow no more): so a 16-bit head of 64 x 128
// lands whole beside a window of up to ~50 tokens, and in two parts beside one of 64. Where not
// even one part fits that share (an fp32 head of 64 x 128 beside a window of 64), the share of
// kOneKernelFewestCtasPerSm CTAs: one CTA an SM fewer cost an fp32 state's one kernel little at
// L = 16 (notes/cuda.md, the probe after v41), where the fused kernel it replaces is slower.
constexpr int kOneKernelFewestCtasPerSm = kMinCtasPerSm - 1;
struct OneKernelSmem {
  int part_rows;
  int64_t bytes;
};
inline OneKernelSmem one_kernel_smem(const ReplayParams& p, int64_t state_bytes, const DotShape& dot,
                                     const RowLayout& layout) {
  const int64_t tile_rows = int64_t(dot.heads) * dot.rows;
  const int64_t least = dot_window_smem_bytes(dot.heads, dot.rows, p.state_dim, state_bytes);
  const int64_t window =
      dot_flush_window_bytes(dot.heads, tile_rows, p.state_dim, p.buffer_len + 1, dtype_size(p.act_dtype));
  for (int ctas = kMinCtasPerSm; ctas >= kOneKernelFewestCtasPerSm; --ctas) {
    const int64_t room = std::max(least, shared_bytes_per_cta(ctas)) - kTileOffset - window;
    const int64_t part =
        room > 0 ? std::min(tile_rows, room / (p.state_dim * state_bytes)) / layout.batch_rows * layout.batch_rows : 0;
    if (part > 0)
      return {int(part), std::max(least, kTileOffset + tile_bytes(part, p.state_dim, state_bytes) + window)};
  }
  return {0, least};
}

// CTAs of the dot kernel as a call's one kernel (checkpoint_dot_kernel with kWindow: its CTAs also
// do their rows' window work), or 0 where it cannot be: it takes the output-only route rounded to
// nearest, a 2- or 4-byte state on a vectorised layout, a thread for each tile row, and room for
// the flush rows' window beside their first tile part; rows of up to 128 values (rows of 256 spill
// the window's early history under the dot kernel's register cap).
inline int64_t dot_window_ctas(const ReplayParams& p, RowLayoutKind kind) {
  const int64_t s = dtype_size(p.state_dtype);
  if ((kind != RowLayoutKind::kN64 && kind != RowLayoutKind::kN128) || p.route == ReplayRoute::kStateAndOutput ||
      p.stochastic_rounding || (s != 2 && s != 4))
    return 0;
  const RowLayout layout = make_row_layout(int(s), kind);
  const DotShape dot = one_kernel_dot_shape(p, s, layout);
  const bool fits = dot.rows <= kThreads && one_kernel_smem(p, s, dot, layout).part_rows > 0;
  return fits ? dot_ctas_per_row(p, dot) * p.batch : 0;
}

// Where a call's one kernel is the dot kernel with the window rather than the fused decode kernel:
// from one of its CTAs an SM to kDotWindowMaxCtasPerSm (H100, Nemotron-H, L = 16, notes/cuda.md
// v40: 2-21% faster at batch 2-8 with fp32 and bf16 states; 7% slower with bf16 at batch 1, 128
// CTAs on 132 SMs, where the fused kernel's 256 CTAs of half a head are shorter chains). From
// there a call with a workspace takes the split path, 1-2% faster at batch 12.
constexpr int64_t kDotWindowMaxCtasPerSm = 8;
inline bool one_kernel_is_dot_kernel(const ReplayParams& p, RowLayoutKind kind) {
  const int64_t ctas = dot_window_ctas(p, kind);
  return ctas >= sm_count() && ctas < kDotWindowMaxCtasPerSm * sm_count();
}

// CTAs per (head, chunk) of a split path's flush kernel, each looping over its share of its
// (head, chunk)'s flush rows: at most `rows` (a bound on the flush rows), and about kFlushWaves
// waves of ctas_per_sm CTAs an SM over the `chunks` (head, chunk)s: a CTA scans the batch once for
// several rows. Measured against one CTA per flush row and against grids of one to five waves
// (notes/spec.md, fourth version): one wave, each CTA a fixed share of many rows, was the slowest.
constexpr int64_t kFlushWaves = 4;
inline int64_t flush_ctas_per_chunk(int64_t ctas_per_sm, int64_t chunks, int64_t rows) {
  const int64_t waves = kFlushWaves * ctas_per_sm * sm_count() / chunks;
  return rows < waves ? rows : waves > 1 ? waves : 1;
}

// Lets `kernel` take `bytes` of dynamic shared memory where that, with its `static_bytes` of static
// shared memory, is past the default limit.
template <typename Kernel> void allow_smem(Kernel kernel, int64_t bytes, int64_t static_bytes = 0) {
  if (bytes + static_bytes > kMaxSharedBytes)
    REPLAYSSM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace replayssm::cuda
