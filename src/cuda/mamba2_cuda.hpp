// The CUDA backend of the Mamba-2 entry points (validated, flattened calls from src/api).
//
// Serving-engine rules that every function here keeps:
// - it launches on the caller's stream (nullptr: the default stream) and nowhere else, on the
//   device of the tensors (made current for the call when the caller's current device differs);
// - it allocates nothing (replay_decode's optional scratch is the caller's workspace), never
//   synchronises with the host and never reads a cursor on the host: it can be captured in a CUDA
//   graph and replayed, the flush being decided per row on the device;
// - the grid depends only on the (padded) batch, the geometry and the dtypes;
// - a row whose slot is pad_slot_id returns before touching the state, the caches or its out row
//   (kernels may have read its own inputs first: they lie in the padded batch); so does a row
//   whose slot or cursor is out of range on the device (the caller's bug, but never an access out
//   of bounds).
#pragma once

#include "api/params.hpp"

namespace replayssm::cuda {

void selective_state_update(const Mamba2Params& p, void* stream);
void replay_decode(const ReplayParams& p, void* stream);
void replay_advance(const CursorParams& p, void* stream);
void replay_reset(const CursorParams& p, void* stream);

// How a decode kernel is launched. One CTA handles one (row, head, chunk of head_dim rows).
struct LaunchConfig {
  int rows_per_cta = 0;  // head_dim rows per CTA; 0 picks it from the batch and the device
  // A replay with a workspace and the output-only route: 1 takes the split path (checkpoint dots,
  // window kernel, flush kernel), 0 the single kernel, -1 as the call's
  // ExecOptions::window_kernel says.
  int window_kernel = -1;
};

// The configuration the automatic choice makes for a baseline / replay call (never 0 rows).
LaunchConfig auto_launch_config(const Mamba2Params& p);
LaunchConfig auto_launch_config(const ReplayParams& p);

// The entry points with a forced launch configuration (benchmarks and tuning).
void selective_state_update(const Mamba2Params& p, const LaunchConfig& config, void* stream);
void replay_decode(const ReplayParams& p, const LaunchConfig& config, void* stream);

}  // namespace replayssm::cuda
