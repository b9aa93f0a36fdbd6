// The shape of a decode CTA: how a state row (N values) spreads over its lanes, and its shared
// memory. Shared by the kernels (as compile-time constants) and by the host code that picks a
// launch (at run time).
#pragma once

#include <cstdint>

namespace replayssm::cuda {

constexpr int kThreads = 128;      // threads per CTA of every decode kernel
constexpr int kMaxStateDim = 256;  // the widest state row a row group covers
constexpr int kMaxRowsPerCta = 128;  // at most kThreads: the replay gives each chunk row a thread
static_assert(kMaxRowsPerCta <= kThreads, "one thread per chunk row");
constexpr int kMaxBufferLen = 64;
constexpr int64_t kMaxSharedBytes = 48 * 1024;  // the default limit of dynamic shared memory
// The replay's decode and dot kernels cap their registers so that this many CTAs fit an SM (80
// registers a thread): about as many as the shared memory of a whole-head fp32 tile allows.
constexpr int kMinCtasPerSm = 6;

// Shared memory of a decode CTA: an mbarrier, then the chunk's state tile (rows_per_cta x N
// elements of the state type, 16-byte aligned for the bulk copy engine), then floats: for the
// baseline x and z of the chunk's rows; for the replay the window's weights and B_j . C (one per
// token), the checkpoint decay, z, and the window's x (L x window_pitch floats).
constexpr int64_t kTileOffset = 128;  // bytes
constexpr int kWeightsOffset = 0;     // floats, from the end of the tile
constexpr int kBCOffset = kMaxBufferLen;
constexpr int kDecayOffset = 2 * kMaxBufferLen;
constexpr int kWindowZOffset = 2 * kMaxBufferLen + 4;  // z (rows), then the row scales (rows)

constexpr int64_t round16(int64_t bytes) { return (bytes + 15) / 16 * 16; }
constexpr int64_t tile_bytes(int64_t rows_per_cta, int64_t state_dim, int64_t state_bytes) {
  return round16(rows_per_cta * state_dim * state_bytes);
}
// Floats between two tokens of the window's x: rows_per_cta rounded up to the 32 banks, plus the
// row groups of a warp, so that the lanes of a warp reading x_j[i] (j = lane of the row group,
// i = row of the group) hit distinct banks.
constexpr int64_t window_pitch(int64_t rows_per_cta, int64_t lanes) {
  return (rows_per_cta + 31) / 32 * 32 + 32 / lanes;
}
constexpr int64_t baseline_smem_bytes(int64_t rows_per_cta, int64_t state_dim, int64_t state_bytes) {
  return kTileOffset + tile_bytes(rows_per_cta, state_dim, state_bytes) + 2 * rows_per_cta * 4;
}
constexpr int64_t replay_smem_bytes(int64_t rows_per_cta, int64_t state_dim, int64_t state_bytes,
                                    int64_t buffer_len, int64_t lanes) {
  return kTileOffset + tile_bytes(rows_per_cta, state_dim, state_bytes) +
         (kWindowZOffset + 2 * rows_per_cta + buffer_len * window_pitch(rows_per_cta, lanes)) * 4;
}

// The split path's dot kernel: a tile of `rows` head_dim rows of each of `heads` heads, then
// their row scales (8-bit checkpoints).
constexpr int64_t dot_smem_bytes(int64_t heads, int64_t rows, int64_t state_dim, int64_t state_bytes) {
  return kTileOffset + tile_bytes(heads * rows, state_dim, state_bytes) + heads * rows * 4;
}
// The dot kernel as the one kernel of a small call (CtaWindow) also holds, after those bytes, its
// heads' window weights and decays and the window's B_j . C; a warp weighs each head (at most
// kThreads / 32 heads; one_kernel_dot_shape gives one).
constexpr int64_t dot_window_smem_bytes(int64_t heads, int64_t rows, int64_t state_dim, int64_t state_bytes) {
  return dot_smem_bytes(heads, rows, state_dim, state_bytes) + (heads * (kMaxBufferLen + 1) + kMaxBufferLen) * 4;
}

// A flush row's CTA in a dot kernel stages its window at the end of its tile's bytes (the one
// kernel's: of its shared memory), past its tile's first part (the rows it folds at a time), in
// 16-byte pieces: each head's weights (kMaxBufferLen floats) and four floats (its decay first),
// then, as stored, `staged_rows` rows of N values (B of each token, and C in standard decode;
// pitch dot_flush_n_pitch) and as many rows of the CTA's tile rows (x of each token, and z in
// standard decode; pitch dot_flush_x_pitch).
constexpr int64_t dot_flush_x_pitch(int64_t tile_rows, int64_t act_bytes) {
  return round16(tile_rows * act_bytes) / act_bytes;
}
// The staged N-vectors' rows are 16 bytes longer than their values need, so that for N = 64 and
// 128 eight consecutive rows start in different banks (the tensor-core fold reads 8 x 8 blocks of
// them: kTensorCoreFold).
constexpr int64_t dot_flush_n_pitch(int64_t state_dim, int64_t act_bytes) {
  return (round16(state_dim * act_bytes) + 16) / act_bytes;
}
constexpr int64_t dot_flush_window_bytes(int64_t heads, int64_t tile_rows, int64_t state_dim,
                                         int64_t staged_rows, int64_t act_bytes) {
  return heads * (kMaxBufferLen + 4) * 4 + staged_rows * dot_flush_n_pitch(state_dim, act_bytes) * act_bytes +
         staged_rows * round16(tile_rows * act_bytes);
}
// The tile rows such a CTA of the split path folds at a time (the window takes the rest of the
// tile's bytes): whole batches of rows, 0 when not even one fits. The one kernel's may take more
// shared memory (one_kernel_smem).
constexpr int64_t dot_flush_part_rows(int64_t heads, int64_t rows, int64_t state_dim, int64_t state_bytes,
                                      int64_t staged_rows, int64_t act_bytes, int64_t batch_rows) {
  const int64_t room = tile_bytes(heads * rows, state_dim, state_bytes) -
                       dot_flush_window_bytes(heads, heads * rows, state_dim, staged_rows, act_bytes);
  return room > 0 ? room / (state_dim * state_bytes) / batch_rows * batch_rows : 0;
}

// The split path's flush kernel: the replay's, then the window's B widened (L x N floats, 16-byte
// aligned); besides, kFlushScanBytes of static shared memory for its scan of the batch's rows
// (each block's taken rows and slots, two counts per warp), which the dynamic shared memory
// follows at its 128-byte alignment: the CTA takes kFlushStaticBytes more than its dynamic bytes
// (ptxas reports 1,664 for the flush kernels).
constexpr int64_t kFlushScanBytes = kThreads * (4 + 8) + 2 * (kThreads / 32) * 4;
constexpr int64_t kFlushStaticBytes = (kFlushScanBytes + 127) / 128 * 128;
constexpr int64_t flush_smem_bytes(int64_t rows_per_cta, int64_t state_dim, int64_t state_bytes,
                                   int64_t buffer_len, int64_t lanes) {
  return replay_smem_bytes(rows_per_cta, state_dim, state_bytes, buffer_len, lanes) + 12 +
         buffer_len * state_dim * 4;
}

// The window kernel of the split path: one CTA per (batch row, up to kMaxWindowHeads heads of one
// group); each thread `rows` consecutive head_dim rows of one head (kWindowRowsFew or
// kWindowRowsMany; head_dim a multiple of it), each warp the weights of up to kWindowHeadsPerWarp
// heads, each thread the cached x of up to kWindowStagedBytes at a time, copied into its own
// shared memory (in one round: up to kWindowOneRoundTokens tokens, and as many of B). Many rows a
// thread take fewer instructions, few rows a shorter chain: a grid of fewer window CTAs than
// kWindowRowsManyCtasPerSm per SM takes few (notes/cuda.md, v12).
constexpr int kWindowThreads = 512;
constexpr int kMaxWindowHeads = 16;
constexpr int kWindowRowsFew = 4, kWindowRowsMany = 8;
constexpr int kWindowRowsManyCtasPerSm = 1;
constexpr int kWindowHeadsPerWarp = 4;
constexpr int kWindowStagedBytes = 128;
constexpr int kWindowOneRoundTokens = 32;
// The window kernel's static shared memory, rounded up (ptxas reports 4,736 bytes).
constexpr int64_t kWindowStaticBytes = 5 * 1024;
// Of `tokens` tokens, those one round takes: a thread's staged cached x (buffer_len - 1 tokens),
// then the window's B (buffer_len tokens).
constexpr int window_round_tokens(int tokens) {
  return tokens < kWindowOneRoundTokens ? tokens : kWindowOneRoundTokens;
}
constexpr int64_t window_smem_bytes(int64_t threads, int64_t rows, int64_t act_bytes, int64_t buffer_len,
                                    int64_t state_dim, bool one_round) {
  if (!one_round) return threads * kWindowStagedBytes;
  return threads * window_round_tokens(int(buffer_len - 1)) * rows * act_bytes +
         window_round_tokens(int(buffer_len)) * state_dim * act_bytes;
}
constexpr int64_t window_threads(int64_t heads, int64_t head_dim, int64_t rows) {
  const int64_t for_rows = (heads * head_dim / rows + 31) / 32 * 32;
  const int64_t for_weights = (heads + kWindowHeadsPerWarp - 1) / kWindowHeadsPerWarp * 32;
  return for_rows > for_weights ? for_rows : for_weights;
}
// Heads per window CTA: the group's heads in as few CTAs as kMaxWindowHeads and kWindowThreads
// allow, spread evenly (0: not even one head fits).
constexpr int window_heads(int64_t heads_per_group, int64_t head_dim, int64_t rows) {
  int64_t most = heads_per_group < kMaxWindowHeads ? heads_per_group : kMaxWindowHeads;
  while (most > 0 && window_threads(most, head_dim, rows) > kWindowThreads) --most;
  if (most == 0) return 0;
  const int64_t ctas = (heads_per_group + most - 1) / most;
  return int((heads_per_group + ctas - 1) / ctas);
}

// The layouts a kernel is compiled for: N = 64, 128 or 256 with 16-byte accesses, or any
// N <= kMaxStateDim with scalar accesses (unaligned tensors, other state dims).
enum class RowLayoutKind { kN64, kN128, kN256, kGeneric };

// A "row group" of `lanes` consecutive lanes owns one state row at a time: lane l holds the
// vectors l, l + lanes, ... of `vec` elements each. The vectorised layouts give each lane up to 4
// vectors (64 bytes) of a row, with at least 8 lanes per row so that a quarter warp reads 128
// contiguous bytes of the tile (no bank conflict): every row then pays its few-level shuffle
// reduction and its output epilogue over enough elements. Each thread works on `rows` rows at a
// time, for independent reductions; lane k < rows of a row group writes the output of row k.
struct RowLayout {
  int vec = 1;            // elements per access
  int lanes = 32;         // lanes per row group (a power of two, 8 to 32)
  int vecs_per_lane = 1;  // accesses per lane per row
  int rows = 1;           // rows per thread per batch
  int row_groups = kThreads / 32;
  int batch_rows = kThreads / 32;  // rows per CTA per batch: rows * row_groups
  int cover_n = kMaxStateDim;      // state values one row group covers
};

constexpr RowLayout make_row_layout(int state_bytes, RowLayoutKind kind) {
  RowLayout l;
  if (kind == RowLayoutKind::kGeneric) {
    l.vec = 1;
    l.lanes = 32;
    l.cover_n = kMaxStateDim;
    l.vecs_per_lane = l.cover_n / l.lanes;
    l.rows = 1;
  } else {
    l.cover_n = kind == RowLayoutKind::kN64 ? 64 : kind == RowLayoutKind::kN128 ? 128 : 256;
    l.vec = state_bytes == 1 ? 8 : 16 / state_bytes;  // 8-bit: 8-byte accesses, still 8+ lanes a row
    const int vectors = l.cover_n / l.vec;
    l.vecs_per_lane = vectors / 8 < 1 ? 1 : vectors / 8 > 4 ? 4 : vectors / 8;
    l.lanes = vectors / l.vecs_per_lane;
    l.rows = l.vecs_per_lane * l.vec <= 16 ? 2 : 1;  // at most 32 state values a thread
  }
  l.row_groups = kThreads / l.lanes;
  l.batch_rows = l.rows * l.row_groups;
  return l;
}

}  // namespace replayssm::cuda
