// The CPU backend of speculative decoding: fp32 arithmetic, multithreaded over (row, head).
#pragma once

#include "api/spec_params.hpp"

namespace replayssm::cpu {

void spec_verify(const SpecVerifyParams& p);
void spec_state_update(const SpecBaselineParams& p);

// Ring updates, shared by the reference and CPU backends (host memory).
void spec_commit(const SpecRingParams& p);
void spec_reset(const SpecRingParams& p);

}  // namespace replayssm::cpu
