// Every CUDA runtime call of the backend goes through REPLAYSSM_CUDA_CHECK: a failure throws
// replayssm::CudaError naming the statement, the file and the line (library code never aborts).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "replayssm/error.hpp"

namespace replayssm::cuda {

// A failed call also leaves its error as the runtime's last error, which the next launch check of
// this thread would report as its own: it is read (and so cleared) here. A sticky error (a
// faulted context) stays.
[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* statement,
                                          const char* file, int line) {
  (void)cudaGetLastError();
  throw CudaError(std::string("replayssm: CUDA error '") + cudaGetErrorString(status) + "' (" +
                  cudaGetErrorName(status) + ") in " + statement + " at " + file + ":" +
                  std::to_string(line));
}

}  // namespace replayssm::cuda

#define REPLAYSSM_CUDA_CHECK(statement)                                                  \
  do {                                                                                   \
    const cudaError_t replayssm_status_ = (statement);                                   \
    if (replayssm_status_ != cudaSuccess)                                                \
      ::replayssm::cuda::throw_cuda_error(replayssm_status_, #statement, __FILE__, __LINE__); \
  } while (0)

namespace replayssm::cuda {

// Makes the tensors' device current for the scope of a call and restores the caller's after (a
// no-op when it already is current): the data, not the caller's current device, decides where
// the kernels run.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) : device_(device) {
    REPLAYSSM_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device_) REPLAYSSM_CUDA_CHECK(cudaSetDevice(device_));
  }
  ~ScopedDevice() {
    if (previous_ != device_) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int device_;
  int previous_ = 0;
};

}  // namespace replayssm::cuda
