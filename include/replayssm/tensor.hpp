// A non-owning strided view of a tensor: the only way data enters the library.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "replayssm/dtype.hpp"

namespace replayssm {

enum class DeviceType : int32_t { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int32_t index = 0;
};

inline const char* device_name(DeviceType t) { return t == DeviceType::kCuda ? "cuda" : "cpu"; }

constexpr int kMaxRank = 6;

// Shape and strides count elements, not bytes. A default-constructed view (data == nullptr)
// stands for an absent optional argument.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  Device device{};
  int32_t rank = 0;
  int64_t shape[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};

  bool defined() const { return data != nullptr; }
  int64_t size(int d) const { return shape[d]; }
  int64_t stride(int d) const { return strides[d]; }

  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= shape[d];
    return n;
  }

  template <typename T> T* ptr() const { return static_cast<T*>(data); }

  // A row-major contiguous view of `data`.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> dims,
                               Device device = {}) {
    TensorView t;
    t.data = data;
    t.dtype = dtype;
    t.device = device;
    t.rank = int32_t(dims.size());
    int d = 0;
    for (int64_t s : dims) t.shape[d++] = s;
    int64_t stride = 1;
    for (d = t.rank - 1; d >= 0; --d) {
      t.strides[d] = stride;
      stride *= t.shape[d];
    }
    return t;
  }
};

}  // namespace replayssm
