// runtime.hpp for a build without CUDA.
#include "replayssm/runtime.hpp"

namespace replayssm {

bool built_with_cuda() { return false; }
int cuda_device_count() { return 0; }

}  // namespace replayssm
