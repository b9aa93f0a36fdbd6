// The validated, flattened form of a speculative call (see params.hpp). Built only by
// validate_spec.cpp.
#pragma once

#include <cstdint>

#include "api/params.hpp"
#include "replayssm/mamba2_spec.hpp"

namespace replayssm {

// A window of T tokens per row. The Mamba2Params part describes window position 0 (its pointers
// are those of token 0, its batch strides those of the window tensors); the token strides step
// from one position to the next.
struct WindowParams : Mamba2Params {
  int64_t window = 0;  // T
  int64_t x_stride_token = 0, dt_stride_token = 0, B_stride_token = 0, C_stride_token = 0;
  int64_t z_stride_token = 0, out_stride_token = 0;
  const int32_t* num_valid_tokens = nullptr;  // (batch) or nullptr: every row carries T tokens
  int64_t num_valid_tokens_stride = 1;
};

// Tokens that row `row` carries.
REPLAYSSM_HOST_DEVICE int64_t valid_tokens(const WindowParams& p, int64_t row) {
  return p.num_valid_tokens ? p.num_valid_tokens[row * p.num_valid_tokens_stride] : p.window;
}

// The decode step made of token t of every row: the same call with the pointers moved to position t.
inline Mamba2Params window_position(const WindowParams& p, int64_t t) {
  Mamba2Params q = p;
  const int64_t act = dtype_size(p.act_dtype);
  auto moved = [t](const void* base, int64_t stride, int64_t element_bytes) {
    return base ? static_cast<const char*>(base) + t * stride * element_bytes : nullptr;
  };
  q.x = moved(p.x, p.x_stride_token, act);
  q.dt = moved(p.dt, p.dt_stride_token, dtype_size(p.dt_dtype));
  q.B = moved(p.B, p.B_stride_token, act);
  q.C = moved(p.C, p.C_stride_token, act);
  q.z = moved(p.z, p.z_stride_token, act);
  q.out = const_cast<char*>(moved(p.out, p.out_stride_token, act));
  return q;
}

struct SpecVerifyParams : WindowParams {
  int64_t buffer_len = 0;  // L
  int64_t ring_len = 0;    // R, a power of two
  void* x_cache = nullptr;  // (slots, H, R, P)
  int64_t xc_stride_slot = 0, xc_stride_head = 0, xc_stride_pos = 0;
  void* B_cache = nullptr;  // (slots, G, R, N)
  int64_t Bc_stride_slot = 0, Bc_stride_group = 0, Bc_stride_pos = 0;
  float* dt_cache = nullptr;  // (slots, H, R)
  int64_t dtc_stride_slot = 0, dtc_stride_head = 0;
  const int32_t* ring = nullptr;  // (slots, 2): origin, committed
  int64_t ring_stride_slot = 2, ring_stride_field = 1;
  // CUDA only, or nullptr: the split path's checkpoint dots S0_i . C_t of each (row, position,
  // head) (batch, T, H, P), written by its dot kernel and read by its window kernel.
  float* workspace = nullptr;
  WindowKernel window_kernel = WindowKernel::kAuto;  // used with a workspace
};

constexpr int64_t spec_workspace_floats(int64_t batch, int64_t window, int64_t nheads, int64_t head_dim) {
  return batch * window * nheads * head_dim;
}

// The baseline: state_batch_indices is (batch, T); Mamba2Params::state_batch_indices points at
// column 0 (so slot_of_row() tells pad rows), the token stride steps along a row.
struct SpecBaselineParams : WindowParams {
  int64_t state_batch_indices_stride_token = 1;
  const int32_t* num_accepted_tokens = nullptr;  // (batch)
  int64_t num_accepted_tokens_stride = 1;
};

// Slot that holds the state after window position t of `row` (baseline).
REPLAYSSM_HOST_DEVICE int64_t baseline_slot(const SpecBaselineParams& p, int64_t row, int64_t t) {
  return p.state_batch_indices[row * p.state_batch_indices_stride +
                               t * p.state_batch_indices_stride_token];
}

// spec_commit and spec_reset.
struct SpecRingParams {
  int32_t device_index = 0;  // the CUDA device of the ring (CUDA backend)
  int32_t* ring = nullptr;    // (slots, 2): origin, committed
  int64_t ring_stride_slot = 2, ring_stride_field = 1;
  int64_t slots = 0;
  int64_t window = 0, buffer_len = 0, ring_len = 0;  // commit only
  const int32_t* slot_ids = nullptr;  // (count): state_batch_indices (commit) or slots (reset)
  int64_t slot_ids_stride = 1;
  int64_t count = 0;  // commit with slot_ids == nullptr: row i uses slot i
  const int32_t* num_accepted_tokens = nullptr;  // (count), commit only
  int64_t num_accepted_tokens_stride = 1;
  int64_t pad_slot_id = -1;
};

// The ring of a slot after a commit of `accepted` inputs (the one rule, host and device).
struct RingEntry {
  int32_t origin, committed;
};
REPLAYSSM_HOST_DEVICE RingEntry committed_ring(RingEntry r, int32_t accepted, int64_t window,
                                               int64_t buffer_len, int64_t ring_len) {
  if (spec_flushes(r.committed, window, buffer_len))
    return RingEntry{int32_t((r.origin + r.committed) & (ring_len - 1)), accepted};
  return RingEntry{r.origin, r.committed + accepted};
}

}  // namespace replayssm
