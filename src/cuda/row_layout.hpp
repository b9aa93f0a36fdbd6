// The shape of a decode CTA: how state rows spread over the lanes of a warp, and the shared memory
// of the replay. Shared by the kernels (as compile-time constants) and by the host code that picks
// a launch (at run time).
#pragma once

#include <cstdint>

namespace replayssm::cuda {

constexpr int kThreads = 128;  // threads per CTA of every decode kernel
constexpr int kWarps = kThreads / 32;
constexpr int kMaxStateDim = 256;  // the widest state row a lane group covers
constexpr int kMaxBufferLen = 64;

// The layouts a kernel is compiled for: N = 64, 128 or 256 with 16-byte accesses, or any
// N <= kMaxStateDim with scalar accesses (unaligned tensors, other state dims).
enum class RowLayoutKind { kN64, kN128, kN256, kGeneric };

// A group of `lanes` consecutive lanes shares one state row: lane l of the group reads the
// accesses l, l + lanes, ... of `vec` elements each (16 bytes), so one warp access reads
// 32 / lanes whole consecutive rows of the shared-memory tile, 512 contiguous bytes. Each lane
// works on `rows_per_lane` rows (as many as 64 registers of state would hold); their dot products
// are summed by a transposing reduction that leaves each row's sum in lanes / rows_per_lane lanes
// of its group.
struct RowLayout {
  int vec = 1;            // elements per access
  int lanes = 32;         // lanes per row (a power of two, 8 to 32)
  int vecs_per_lane = 1;  // accesses per lane per row
  int rows_per_lane = 1;  // rows a lane works on (a power of two, at most `lanes`)
  int cover_n = kMaxStateDim;  // state values one row's lanes cover

  constexpr int rows_per_access() const { return 32 / lanes; }
  // The most chunk rows one warp works on, and so one CTA.
  constexpr int max_rows_per_warp() const { return rows_per_lane * rows_per_access(); }
  constexpr int max_rows_per_cta() const { return kWarps * max_rows_per_warp(); }
};

constexpr RowLayout make_row_layout(int state_bytes, RowLayoutKind kind) {
  RowLayout l;
  if (kind == RowLayoutKind::kGeneric) {
    l.vec = 1;
    l.lanes = 32;
    l.cover_n = kMaxStateDim;
    l.vecs_per_lane = l.cover_n / l.lanes;
    l.rows_per_lane = 4;
    return l;
  }
  l.cover_n = kind == RowLayoutKind::kN64 ? 64 : kind == RowLayoutKind::kN128 ? 128 : 256;
  l.vec = 16 / state_bytes;
  const int accesses = l.cover_n / l.vec;  // 16-byte accesses per row
  l.vecs_per_lane = accesses > 32 ? accesses / 32 : 1;
  l.lanes = accesses / l.vecs_per_lane;
  const int register_rows = 16 / l.vecs_per_lane;  // 16 accesses = 64 registers
  const int rows = state_bytes == 4 ? register_rows : register_rows / 2;  // 16-bit: widened x2
  l.rows_per_lane = rows < l.lanes ? rows : l.lanes;
  return l;
}

// Shared memory of a decode CTA: an mbarrier, then the chunk's state tile (rows_per_cta rows of N
// values of the state type, 16-byte aligned for the bulk copy engine). Then, for the replay, the
// window's weights, B_j . C per token and the checkpoint decay, and the stage where rows that form
// their state put stage_tokens() tokens of the window at a time: x (floats, token-major) and B (as
// stored). Windows longer than a stage keep the partial state in fp32 between stages, in the tile
// itself: the replay sizes the tile for fp32 values when L > stage_tokens(). A stage holds 16
// tokens for a 16-bit state (windows up to 16 then never widen the tile) and 8 for an fp32 one (so
// that six 32 KiB tiles still fit an SM).
constexpr int64_t kDefaultSharedBytes = 48 * 1024;  // more needs an opt-in per kernel
constexpr int64_t kTileOffset = 128;                // bytes
constexpr int kWeightsOffset = 0;     // floats, from the end of the tile
constexpr int kBCOffset = kMaxBufferLen;
constexpr int kDecayOffset = 2 * kMaxBufferLen;
constexpr int kStagedXOffset = 2 * kMaxBufferLen + 4;
constexpr int kMaxStageTokens = 16;
constexpr int stage_tokens(int64_t state_bytes) { return state_bytes == 4 ? 8 : kMaxStageTokens; }

constexpr int64_t tile_bytes(int64_t rows_per_cta, int64_t state_dim, int64_t state_bytes) {
  return (rows_per_cta * state_dim * state_bytes + 15) / 16 * 16;
}
constexpr int64_t baseline_smem_bytes(int64_t rows_per_cta, int64_t state_dim, int64_t state_bytes) {
  return kTileOffset + tile_bytes(rows_per_cta, state_dim, state_bytes);
}
constexpr int64_t replay_tile_bytes(int64_t rows_per_cta, int64_t state_dim, int64_t state_bytes,
                                    int64_t buffer_len) {
  return tile_bytes(rows_per_cta, state_dim, buffer_len > stage_tokens(state_bytes) ? 4 : state_bytes);
}
constexpr int64_t replay_smem_bytes(int64_t rows_per_cta, int64_t state_dim, int64_t state_bytes,
                                    int64_t buffer_len, int64_t act_bytes) {
  return kTileOffset + replay_tile_bytes(rows_per_cta, state_dim, state_bytes, buffer_len) +
         (kStagedXOffset + stage_tokens(state_bytes) * rows_per_cta) * 4 +
         stage_tokens(state_bytes) * state_dim * act_bytes;
}

}  // namespace replayssm::cuda
