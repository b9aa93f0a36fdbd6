// Layer shapes of real models, and custom ones from the command line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "args.hpp"

namespace replayssm::tool {

// One Mamba-2 layer: H heads of P channels, G groups of N state channels.
struct Geometry {
  std::string name;
  int64_t heads = 0;      // H
  int64_t head_dim = 0;   // P
  int64_t state_dim = 0;  // N
  int64_t groups = 0;     // G; H / G heads share one B and C

  int64_t heads_per_group() const { return heads / groups; }
  // "nemotron-h (H=128, P=64, N=128, G=8)"
  std::string describe() const;
};

const std::vector<Geometry>& geometry_presets();

// --geometry and the --heads / --head-dim / --state-dim / --groups overrides.
std::vector<Option> geometry_options();

// The preset named by --geometry with any overrides applied (then named "custom").
Geometry geometry_from_args(const Args& args);

}  // namespace replayssm::tool
