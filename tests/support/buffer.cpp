#include "support/buffer.hpp"

#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "replayssm/error.hpp"
#include "replayssm/runtime.hpp"

#if defined(REPLAYSSM_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace replayssm {

void PrintTo(Backend backend, std::ostream* os) { *os << backend_name(backend); }

}  // namespace replayssm

namespace replayssm::test {
namespace {

#if defined(REPLAYSSM_WITH_CUDA)
std::string cuda_failure(cudaError_t status, const char* call, const char* file, int line) {
  return std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
         cudaGetErrorString(status);
}

void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess) throw CudaError(cuda_failure(status, call, file, line));
}

#define CHECK_CUDA(call) check_cuda((call), #call, __FILE__, __LINE__)
#else
[[noreturn]] void no_device_memory() {
  throw CudaError("device memory requested, but this build of replayssm has no CUDA support");
}
#endif

bool on_host(Device device) { return device.type == DeviceType::kCpu; }

}  // namespace

Device device_for(Backend backend) {
  if (backend == Backend::kCuda) return Device{DeviceType::kCuda, 0};
  return Device{};
}

const char* backend_unavailable_reason(Backend backend) {
  if (backend != Backend::kCuda) return nullptr;
  if (!built_with_cuda()) return "no CUDA device (this build has no CUDA support)";
  if (cuda_device_count() == 0) return "no CUDA device";
  return nullptr;
}

Buffer::Buffer(Device device, size_t bytes) : device_(device), bytes_(bytes) {
  const size_t allocated = bytes == 0 ? 1 : bytes;  // a distinct, non-null address even when empty
  if (on_host(device)) {
    data_ = ::operator new(allocated);
    return;
  }
#if defined(REPLAYSSM_WITH_CUDA)
  CHECK_CUDA(cudaSetDevice(device.index));
  CHECK_CUDA(cudaMalloc(&data_, allocated));
#else
  no_device_memory();
#endif
}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& other) noexcept
    : device_(other.device_), data_(other.data_), bytes_(other.bytes_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    device_ = other.device_;
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void Buffer::release() {
  if (data_ == nullptr) return;
  if (on_host(device_)) {
    ::operator delete(data_);
  } else {
#if defined(REPLAYSSM_WITH_CUDA)
    // A destructor cannot throw: a failed free fails the running test instead.
    const cudaError_t status = cudaFree(data_);
    if (status != cudaSuccess) ADD_FAILURE() << cuda_failure(status, "cudaFree(data_)", __FILE__, __LINE__);
#endif
  }
  data_ = nullptr;
}

void Buffer::upload(const void* host, size_t offset, size_t size) {
  if (offset + size > bytes_)
    throw std::out_of_range("Buffer::upload past the end: " + std::to_string(offset + size) + " > " +
                            std::to_string(bytes_));
  char* dst = static_cast<char*>(data_) + offset;
  if (on_host(device_)) {
    std::memcpy(dst, host, size);
    return;
  }
#if defined(REPLAYSSM_WITH_CUDA)
  CHECK_CUDA(cudaMemcpy(dst, host, size, cudaMemcpyHostToDevice));
#else
  no_device_memory();
#endif
}

void Buffer::download(void* host, size_t offset, size_t size) const {
  if (offset + size > bytes_)
    throw std::out_of_range("Buffer::download past the end: " + std::to_string(offset + size) +
                            " > " + std::to_string(bytes_));
  const char* src = static_cast<const char*>(data_) + offset;
  if (on_host(device_)) {
    std::memcpy(host, src, size);
    return;
  }
#if defined(REPLAYSSM_WITH_CUDA)
  // Synchronous on the default stream: waits for the kernels launched before it and reports
  // their errors.
  CHECK_CUDA(cudaMemcpy(host, src, size, cudaMemcpyDeviceToHost));
#else
  no_device_memory();
#endif
}

void Buffer::upload(const std::vector<uint8_t>& host) {
  if (host.size() != bytes_)
    throw std::invalid_argument("Buffer::upload of " + std::to_string(host.size()) +
                                " bytes into a buffer of " + std::to_string(bytes_));
  upload(host.data(), 0, bytes_);
}

std::vector<uint8_t> Buffer::download() const {
  std::vector<uint8_t> host(bytes_);
  download(host.data(), 0, bytes_);
  return host;
}

TensorView Buffer::view(DType dtype, const std::vector<int64_t>& shape, std::vector<int64_t> strides,
                        int64_t offset_elements) const {
  return make_view(static_cast<char*>(data_) + offset_elements * dtype_size(dtype), dtype, shape,
                   device_, std::move(strides));
}

Buffer upload_copy(Device device, const HostTensor& host) {
  Buffer b(device, host.bytes().size());
  b.upload(host);
  return b;
}

}  // namespace replayssm::test
