// Device memory for workloads: buffers on CUDA device 0, copied to and from the host.
#include <cuda_runtime.h>

#include <string>

#include "replayssm/error.hpp"
#include "replayssm/runtime.hpp"
#include "workload.hpp"

namespace replayssm::tool {
namespace {

void check(cudaError_t status, const char* call, int line) {
  if (status != cudaSuccess)
    throw CudaError(std::string(call) + " failed: " + cudaGetErrorString(status) + " (" + __FILE__ +
                    ":" + std::to_string(line) + ")");
}

#define REPLAYSSM_TOOL_CUDA_CHECK(call) check((call), #call, __LINE__)

class CudaMemory : public Memory {
 public:
  CudaMemory() {
    if (cuda_device_count() == 0) throw CudaError("device cuda: no CUDA device is available");
    REPLAYSSM_TOOL_CUDA_CHECK(cudaSetDevice(0));
  }

  Device device() const override { return Device{DeviceType::kCuda, 0}; }

  void* allocate(size_t bytes) override {
    void* data = nullptr;
    REPLAYSSM_TOOL_CUDA_CHECK(cudaMalloc(&data, bytes));
    REPLAYSSM_TOOL_CUDA_CHECK(cudaMemset(data, 0, bytes));
    return data;
  }
  void release(void* data) noexcept override { cudaFree(data); }
  // Synchronous copies: they wait for the kernels queued on the default stream.
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    REPLAYSSM_TOOL_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    REPLAYSSM_TOOL_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  }
};

}  // namespace

std::unique_ptr<Memory> make_cuda_memory() { return std::make_unique<CudaMemory>(); }

}  // namespace replayssm::tool
