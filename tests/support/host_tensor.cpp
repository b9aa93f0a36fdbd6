#include "support/host_tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace replayssm::test {

TensorView make_view(void* data, DType dtype, const std::vector<int64_t>& shape, Device device,
                     std::vector<int64_t> strides) {
  if (shape.size() > size_t(kMaxRank)) throw std::invalid_argument("make_view: rank too large");
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.rank = int32_t(shape.size());
  if (strides.empty()) {
    strides.assign(shape.size(), 1);
    for (int d = t.rank - 2; d >= 0; --d) strides[d] = strides[d + 1] * shape[d + 1];
  }
  for (int d = 0; d < t.rank; ++d) {
    t.shape[d] = shape[d];
    t.strides[d] = strides[d];
  }
  return t;
}

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

HostTensor::HostTensor(DType dtype, std::vector<int64_t> shape)
    : dtype_(dtype),
      shape_(std::move(shape)),
      bytes_(size_t(element_count(shape_) * dtype_size(dtype))) {}

double HostTensor::get(int64_t i) const {
  const uint64_t b = bits(i);
  switch (dtype_) {
    case DType::kFloat16: return fp16_to_float(uint16_t(b));
    case DType::kBFloat16: return bf16_to_float(uint16_t(b));
    case DType::kFloat32: return bits_float(uint32_t(b));
    case DType::kFloat64: {
      double v;
      std::memcpy(&v, &b, 8);
      return v;
    }
    case DType::kInt32: return double(int32_t(uint32_t(b)));
    case DType::kInt8: return double(int8_t(uint8_t(b)));
    case DType::kFloat8E4M3: return e4m3_to_float(uint8_t(b));
  }
  return 0;
}

void HostTensor::set(int64_t i, double v) {
  switch (dtype_) {
    case DType::kFloat16: return set_bits(i, float_to_fp16(float(v)));
    case DType::kBFloat16: return set_bits(i, float_to_bf16(float(v)));
    case DType::kFloat32: return set_bits(i, float_bits(float(v)));
    case DType::kFloat64: {
      uint64_t b;
      std::memcpy(&b, &v, 8);
      return set_bits(i, b);
    }
    case DType::kInt32: return set_bits(i, uint32_t(int32_t(v)));
    case DType::kInt8: return set_bits(i, uint8_t(float_to_int8(float(v))));
    case DType::kFloat8E4M3: return set_bits(i, float_to_e4m3(float(v)));
  }
}

uint64_t HostTensor::bits(int64_t i) const {
  uint64_t b = 0;
  const int64_t size = dtype_size(dtype_);
  std::memcpy(&b, bytes_.data() + i * size, size_t(size));  // little endian
  return b;
}

void HostTensor::set_bits(int64_t i, uint64_t b) {
  const int64_t size = dtype_size(dtype_);
  std::memcpy(bytes_.data() + i * size, &b, size_t(size));
}

void HostTensor::fill_bits(uint64_t b) {
  for (int64_t i = 0; i < numel(); ++i) set_bits(i, b);
}

uint64_t canary_bits(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return 0x7dadu;
    case DType::kBFloat16: return 0x7fadu;
    case DType::kFloat64: return 0x7ff4badbadbadbadull;
    default: return 0x7fbadbadu;
  }
}

namespace {

struct FloatFormat {
  int mantissa_bits;
  int min_exponent;  // of the smallest normal number
};

FloatFormat format_of(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return {10, -14};
    case DType::kBFloat16: return {7, -126};
    case DType::kFloat64: return {52, -1022};
    case DType::kFloat8E4M3: return {3, -6};
    case DType::kInt8: return {7, 7};  // the integers: spacing 1
    default: return {23, -126};
  }
}

}  // namespace

double ulp(DType dtype, double v) {
  const FloatFormat f = format_of(dtype);
  int exponent = f.min_exponent;
  if (v != 0) {
    int e;
    std::frexp(std::fabs(v), &e);  // |v| = m 2^e, m in [0.5, 1): its binade is 2^(e-1)
    exponent = std::max(e - 1, f.min_exponent);
  }
  return std::ldexp(1.0, exponent - f.mantissa_bits);
}

double unit_roundoff(DType dtype) { return std::ldexp(1.0, -format_of(dtype).mantissa_bits - 1); }

const char* short_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "f32";
    case DType::kFloat16: return "f16";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat64: return "f64";
    case DType::kInt32: return "i32";
    case DType::kInt8: return "i8";
    case DType::kFloat8E4M3: return "f8e4m3";
  }
  return "unknown";
}

}  // namespace replayssm::test
