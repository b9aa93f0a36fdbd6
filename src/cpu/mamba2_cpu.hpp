// The CPU backend: fp32 arithmetic, multithreaded over (row, head), vectorisable inner loops.
#pragma once

#include "api/params.hpp"

namespace replayssm::cpu {

void selective_state_update(const Mamba2Params& p);
void replay_decode(const ReplayParams& p);

// Cursor updates, shared by the reference and CPU backends (host memory).
void replay_advance(const CursorParams& p);
void replay_reset(const CursorParams& p);

}  // namespace replayssm::cpu
