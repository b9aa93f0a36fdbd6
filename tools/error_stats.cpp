#include "error_stats.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace replayssm::tool {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// The value next to `v` (representable in `dtype`) towards +infinity or -infinity.
double neighbour(double v, DType dtype, bool up) {
  if (dtype == DType::kFloat32) return std::nextafter(float(v), up ? INFINITY : -INFINITY);
  const bool bf16 = dtype == DType::kBFloat16;
  const uint16_t bits = bf16 ? float_to_bf16(float(v)) : float_to_fp16(float(v));
  const bool negative = (bits & 0x8000u) != 0;
  uint16_t next;
  if ((bits & 0x7fffu) == 0) {
    next = up ? 0x0001u : 0x8001u;  // the smallest subnormal of that sign
  } else {
    next = uint16_t(negative == up ? bits - 1 : bits + 1);  // magnitude down or up
  }
  return bf16 ? bf16_to_float(next) : fp16_to_float(next);
}

}  // namespace

void ErrorStat::add(double error, double reference) {
  if (!(error <= max_error)) max_error = std::isnan(error) ? kInfinity : error;
  max_reference = std::max(max_reference, std::fabs(reference));
}

double rounding_excess(double out, double exact, DType dtype) {
  if (std::isnan(out)) return kInfinity;
  const double lo = (neighbour(out, dtype, false) + out) / 2;
  const double hi = (out + neighbour(out, dtype, true)) / 2;
  return exact < lo ? lo - exact : exact > hi ? exact - hi : 0.0;
}

}  // namespace replayssm::tool
