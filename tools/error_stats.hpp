// Output and state errors against the fp64 oracle, shared by `replayssm verify` and its --spec mode.
#pragma once

#include "replayssm/dtype.hpp"

namespace replayssm::tool {

// The largest error and the largest reference magnitude seen; NaN counts as an infinite error.
struct ErrorStat {
  double max_error = 0, max_reference = 0;
  void add(double error, double reference);
  double relative() const { return max_reference > 0 ? max_error / max_reference : max_error; }
};

// How far `exact` lies outside the interval of values that round to `out` in `dtype`: zero when
// `out` is the correct rounding of `exact`. Both the oracle and the checked kernels round their
// output to the activation dtype; this measures the error beyond that last rounding.
double rounding_excess(double out, double exact, DType dtype);

}  // namespace replayssm::tool
