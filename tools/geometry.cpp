#include "geometry.hpp"

#include <sstream>

namespace replayssm::tool {

std::string Geometry::describe() const {
  std::ostringstream os;
  os << name << " (H=" << heads << ", P=" << head_dim << ", N=" << state_dim << ", G=" << groups
     << ")";
  return os.str();
}

const std::vector<Geometry>& geometry_presets() {
  static const std::vector<Geometry> presets = {
      {"nemotron-h", 128, 64, 128, 8},
      {"mamba2-2.7b", 80, 64, 128, 1},
      {"nemotron-nano-4b", 96, 80, 128, 8},
  };
  return presets;
}

std::vector<Option> geometry_options() {
  std::string names;
  for (const Geometry& g : geometry_presets()) names += (names.empty() ? "" : ", ") + g.name;
  return {
      {"--geometry", "NAME", "layer shape preset: " + names, "nemotron-h"},
      {"--heads", "H", "override the number of heads", ""},
      {"--head-dim", "P", "override the head dimension", ""},
      {"--state-dim", "N", "override the state dimension", ""},
      {"--groups", "G", "override the number of B/C groups (must divide H)", ""},
  };
}

Geometry geometry_from_args(const Args& args) {
  const std::string& name = args.get("--geometry");
  Geometry g;
  for (const Geometry& preset : geometry_presets())
    if (preset.name == name) g = preset;
  if (g.name.empty()) {
    std::string names;
    for (const Geometry& preset : geometry_presets()) names += " " + preset.name;
    throw UsageError("unknown --geometry '" + name + "'; presets:" + names);
  }
  const std::pair<const char*, int64_t*> overrides[] = {
      {"--heads", &g.heads}, {"--head-dim", &g.head_dim}, {"--state-dim", &g.state_dim},
      {"--groups", &g.groups}};
  for (auto [flag, field] : overrides) {
    if (!args.given(flag)) continue;
    *field = parse_int(flag, args.get(flag), 1, 4096);
    g.name = "custom";
  }
  if (g.heads % g.groups != 0)
    throw UsageError("--groups=" + std::to_string(g.groups) + " must divide --heads=" +
                     std::to_string(g.heads));
  return g;
}

}  // namespace replayssm::tool
