// Memory for the tensors of a backend under test: host memory for the reference and CPU backends,
// device memory for the CUDA backend, with copies in both directions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <vector>

#include <gtest/gtest.h>

#include "replayssm/mamba2.hpp"
#include "support/host_tensor.hpp"

namespace replayssm {

// How GoogleTest prints a backend (test parameters, failure messages).
void PrintTo(Backend backend, std::ostream* os);

}  // namespace replayssm

namespace replayssm::test {

// The device whose memory `backend` computes on.
Device device_for(Backend backend);

// Why `backend` cannot run on this machine with this build, or nullptr when it can.
const char* backend_unavailable_reason(Backend backend);

// Skips the current test when `backend` cannot run here (CUDA without a device or without a
// CUDA build), saying why.
#define REPLAYSSM_SKIP_IF_UNAVAILABLE(backend)                                            \
  do {                                                                                     \
    if (const char* why_unavailable = ::replayssm::test::backend_unavailable_reason(backend)) \
      GTEST_SKIP() << why_unavailable;                                                     \
  } while (0)

// An owned allocation on one device. Copies are explicit (upload / download).
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device device, size_t bytes);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

  // Copies `size` bytes between host memory and [offset, offset + size) of this buffer.
  void upload(const void* host, size_t offset, size_t size);
  void download(void* host, size_t offset, size_t size) const;

  // Whole-buffer copies; the host side must have exactly bytes() bytes.
  void upload(const std::vector<uint8_t>& host);
  std::vector<uint8_t> download() const;
  void upload(const HostTensor& host) { upload(host.bytes()); }

  // A view of this buffer (or of the part starting `offset_elements` in).
  TensorView view(DType dtype, const std::vector<int64_t>& shape, std::vector<int64_t> strides = {},
                  int64_t offset_elements = 0) const;

 private:
  void release();

  Device device_{};
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// A buffer on `device` holding a copy of `host`.
Buffer upload_copy(Device device, const HostTensor& host);

}  // namespace replayssm::test
