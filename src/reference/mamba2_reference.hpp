// The fp64 oracle: the Mamba-2 recurrence one token at a time, obviously correct, never optimised.
#pragma once

#include "api/params.hpp"
#include "api/spec_params.hpp"

namespace replayssm::reference {

void selective_state_update(const Mamba2Params& p);

// Replays the buffer step by step from the checkpoint in fp64 (the route is irrelevant here).
void replay_decode(const ReplayParams& p);

// Speculative verify: replays the committed inputs step by step from the checkpoint, then the
// window's tokens one at a time, writing an output after each.
void spec_verify(const SpecVerifyParams& p);

// The baseline speculative path: the window's tokens one at a time, a state written after each.
void spec_state_update(const SpecBaselineParams& p);

}  // namespace replayssm::reference
