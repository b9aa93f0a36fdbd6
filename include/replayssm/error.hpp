// The one exception type of the library: thrown for any invalid argument, before anything is
// written. Library code never exits or aborts.
#pragma once

#include <stdexcept>
#include <string>

namespace replayssm {

class InvalidArgument : public std::invalid_argument {
 public:
  explicit InvalidArgument(const std::string& message) : std::invalid_argument(message) {}
};

// A failure reported by the CUDA runtime (launch or driver error); carries the call, file and line.
class CudaError : public std::runtime_error {
 public:
  explicit CudaError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace replayssm
