// The fp64 oracle: the Mamba-2 recurrence one token at a time, obviously correct, never optimised.
#pragma once

#include "api/params.hpp"

namespace replayssm::reference {

void selective_state_update(const Mamba2Params& p);

// Replays the buffer step by step from the checkpoint in fp64 (the route is irrelevant here).
void replay_decode(const ReplayParams& p);

}  // namespace replayssm::reference
