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

}  // namespace replayssm::tool
