// Modelled memory traffic of one decode step of one layer (method.md, section 8): the bytes a
// kernel must move at the least, the yardstick for achieved bandwidth.
#pragma once

#include <cstdint>

#include "geometry.hpp"
#include "replayssm/dtype.hpp"

namespace replayssm::tool {

// selective_state_update: read and write the state, read x and B/C, write out.
double baseline_bytes_per_step(const Geometry& g, int64_t batch, DType state, DType act);

// ReplaySSM standard decode, amortised over one window of L steps (one flush per row).
double replay_bytes_per_step(const Geometry& g, int64_t batch, int64_t buffer_len, DType state,
                             DType act);

// Speculative decoding, one verify step of T tokens per row (method.md, section 8).
// The baseline reads the state once and writes it after each of the T positions.
double baseline_spec_bytes_per_step(const Geometry& g, int64_t batch, int64_t window, DType state,
                                    DType act);
// ReplaySSM verify: `flushes` is the mean number of flushes per row and verify step, `history` the
// mean number of committed inputs a row replays.
double replay_spec_bytes_per_step(const Geometry& g, int64_t batch, int64_t window, double flushes,
                                  double history, DType state, DType act);

// Bytes one slot holds per layer: the standard decode state; the baseline speculative path's T
// states; ReplaySSM's checkpoint plus its ring of R inputs; a history of `positions` inputs (x, B
// and raw dt: ReplaySSM's caches).
double standard_slot_bytes(const Geometry& g, DType state);
double baseline_spec_slot_bytes(const Geometry& g, int64_t window, DType state);
double replay_spec_slot_bytes(const Geometry& g, int64_t ring_len, DType state, DType act);
double history_slot_bytes(const Geometry& g, int64_t positions, DType act);

// The GPU benches' layer copies (`replayssm bench --device cuda`, the tuning driver): enough of
// them that every step reads its state and its history from memory. Their states span at least
// cold_state_bytes (twice the L2, and no less than the 256 MiB that bench treats as cold on any
// device); their history caches (x, B and raw dt of every slot) twice the L2 too, since
// checkpoints read with an evict-first hint would otherwise leave one layer's history in the L2
// from one step to the next, where in a model the other layers' traffic evicts it.
int64_t cold_state_bytes(int64_t l2_bytes);
int64_t cold_layer_copies(int64_t l2_bytes, int64_t layer_state_bytes, int64_t layer_history_bytes);

}  // namespace replayssm::tool
