// What the CUDA runtime offers this process.
#include <cuda_runtime.h>

#include "replayssm/runtime.hpp"

namespace replayssm {

bool built_with_cuda() { return true; }

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return count;
}

}  // namespace replayssm
