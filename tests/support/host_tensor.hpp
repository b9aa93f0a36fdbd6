// Host arrays of any library dtype, read and written as double, and the bit patterns tests use.
#pragma once

#include <cstdint>
#include <vector>

#include "replayssm/tensor.hpp"

namespace replayssm::test {

// A strided view of `data`; empty `strides` means row-major contiguous.
TensorView make_view(void* data, DType dtype, const std::vector<int64_t>& shape, Device device = {},
                     std::vector<int64_t> strides = {});

int64_t element_count(const std::vector<int64_t>& shape);

// A contiguous row-major host array.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, std::vector<int64_t> shape);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const { return element_count(shape_); }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  std::vector<uint8_t>& bytes() { return bytes_; }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

  // Element i (flat index) as double; set() rounds to the dtype to nearest even.
  double get(int64_t i) const;
  void set(int64_t i, double v);
  // The raw bits of element i (zero-extended).
  uint64_t bits(int64_t i) const;
  void set_bits(int64_t i, uint64_t b);
  void fill_bits(uint64_t b);

  TensorView view(Device device = {}) { return make_view(data(), dtype_, shape_, device); }

 private:
  DType dtype_ = DType::kFloat32;
  std::vector<int64_t> shape_;
  std::vector<uint8_t> bytes_;
};

// A signalling-NaN pattern of `dtype` that no kernel produces (an arithmetic NaN is quiet): the
// canary of elements that must, or must not, be written.
uint64_t canary_bits(DType dtype);

// Distance between consecutive numbers of `dtype` around |v| (the subnormal spacing below the
// normal range).
double ulp(DType dtype, double v);

// Unit roundoff of `dtype`: half the ulp of 1.
double unit_roundoff(DType dtype);

// "f32", "f16", "bf16", "f64", "i32": short names for test names.
const char* short_dtype_name(DType dtype);

}  // namespace replayssm::test
