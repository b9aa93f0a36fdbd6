// The validated, flattened form of a call: raw pointers and element strides, the same for every
// backend. Built only by validate.cpp; a backend never sees an unchecked argument.
#pragma once

#include <cstdint>

#include "common/rounding.hpp"
#include "replayssm/mamba2.hpp"

namespace replayssm {

// A per-head scalar (A, D, dt_bias) broadcast over P (and N): value of head h at data[h * stride].
struct HeadScalar {
  const void* data = nullptr;  // nullptr: absent
  DType dtype = DType::kFloat32;
  int64_t stride = 0;
};

// Every tensor with a last axis has it contiguous; the strides below are of the other axes.
struct Mamba2Params {
  int32_t device_index = 0;  // the CUDA device of the tensors (CUDA backend)
  int64_t batch = 0, nheads = 0, head_dim = 0, state_dim = 0, ngroups = 0, heads_per_group = 0;
  int64_t slots = 0;
  DType act_dtype = DType::kFloat32;
  DType state_dtype = DType::kFloat32;
  DType dt_dtype = DType::kFloat32;

  const void* x = nullptr;  // (batch, H, P)
  int64_t x_stride_batch = 0, x_stride_head = 0;
  const void* dt = nullptr;  // (batch, H)
  int64_t dt_stride_batch = 0, dt_stride_head = 0;
  const void* B = nullptr;  // (batch, G, N)
  int64_t B_stride_batch = 0, B_stride_group = 0;
  const void* C = nullptr;  // (batch, G, N)
  int64_t C_stride_batch = 0, C_stride_group = 0;
  const void* z = nullptr;  // (batch, H, P) or nullptr
  int64_t z_stride_batch = 0, z_stride_head = 0;
  void* out = nullptr;  // (batch, H, P)
  int64_t out_stride_batch = 0, out_stride_head = 0;

  HeadScalar A, D, dt_bias;
  bool dt_softplus = false;
  const int32_t* state_batch_indices = nullptr;  // (batch) or nullptr: row i -> slot i
  int64_t state_batch_indices_stride = 1;
  int64_t pad_slot_id = -1;

  void* state = nullptr;  // (slots, H, P, N)
  int64_t state_stride_slot = 0, state_stride_head = 0, state_stride_p = 0;
};

struct ReplayParams : Mamba2Params {
  int64_t buffer_len = 0;  // L
  ReplayRoute route = ReplayRoute::kAuto;
  void* x_cache = nullptr;  // (slots, H, L, P)
  int64_t xc_stride_slot = 0, xc_stride_head = 0, xc_stride_pos = 0;
  void* B_cache = nullptr;  // (slots, G, L, N)
  int64_t Bc_stride_slot = 0, Bc_stride_group = 0, Bc_stride_pos = 0;
  float* dt_cache = nullptr;  // (slots, H, L)
  int64_t dtc_stride_slot = 0, dtc_stride_head = 0;
  const int32_t* cursors = nullptr;  // (slots)
  int64_t cursors_stride = 1;
  float* state_scale = nullptr;  // (slots, H, P), 8-bit checkpoints only
  int64_t scale_stride_slot = 0, scale_stride_head = 0;
  bool stochastic_rounding = false;
  const int32_t* rounding_seed = nullptr;  // (2), stochastic rounding only
  int64_t rounding_seed_stride = 1;
  int32_t* flush_counts = nullptr;  // (slots), stochastic rounding only
  int64_t flush_counts_stride = 1;
  // CUDA only, or nullptr: the split path's checkpoint dots S0_i . C of each (row, head)
  // (batch, H, P), written by its dot kernel and read by its window kernel.
  float* workspace = nullptr;
  WindowKernel window_kernel = WindowKernel::kAuto;  // used with a workspace
};

constexpr int64_t replay_workspace_floats(int64_t batch, int64_t nheads, int64_t head_dim) {
  return batch * nheads * head_dim;
}

struct CursorParams {
  int32_t device_index = 0;  // the CUDA device of the cursors (CUDA backend)
  int32_t* cursors = nullptr;  // (slots)
  int64_t cursors_stride = 1;
  int64_t slots = 0;
  int64_t buffer_len = 0;             // advance only
  const int32_t* slot_ids = nullptr;  // (count): state_batch_indices (advance) or slots (reset)
  int64_t slot_ids_stride = 1;
  int64_t count = 0;  // advance with slot_ids == nullptr: every slot
  int64_t pad_slot_id = -1;
};

// Slot of batch row `row`, or -1 for a pad row.
REPLAYSSM_HOST_DEVICE int64_t slot_of_row(const Mamba2Params& p, int64_t row) {
  if (p.state_batch_indices == nullptr) return row;
  const int64_t slot = p.state_batch_indices[row * p.state_batch_indices_stride];
  return slot == p.pad_slot_id ? -1 : slot;
}

// The random bits of `slot`'s flush in this call (stochastic rounding, host-readable tensors).
inline FlushRandomBits flush_random_bits(const ReplayParams& p, int64_t slot) {
  if (!p.stochastic_rounding) return FlushRandomBits(0, 0, 0, 0);
  return FlushRandomBits(uint32_t(p.rounding_seed[0]), uint32_t(p.rounding_seed[p.rounding_seed_stride]),
                         uint32_t(slot), uint32_t(p.flush_counts[slot * p.flush_counts_stride]));
}

// Counts the flush of `slot` once all of its heads are written (stochastic rounding only).
inline void count_flush(const ReplayParams& p, int64_t slot) {
  if (!p.stochastic_rounding) return;
  int32_t& count = p.flush_counts[slot * p.flush_counts_stride];
  count = int32_t(uint32_t(count) + 1u);  // wraps: the key only needs to differ between flushes
}

}  // namespace replayssm
