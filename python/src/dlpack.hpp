// The DLPack ABI (data-apis.org DLPack, major version 1): the C structs a producer's capsule
// points to. Only what the binding reads is declared; the layouts are fixed by the standard.
#pragma once

#include <cstdint>

namespace replayssm::python::dlpack {

enum DeviceType : int32_t {
  kCpu = 1,
  kCuda = 2,
  kCudaHost = 3,
  kCudaManaged = 13,
};

enum TypeCode : uint8_t {
  kInt = 0,
  kUInt = 1,
  kFloat = 2,
  kBfloat = 4,
};

struct Device {
  int32_t device_type;
  int32_t device_id;
};

struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;    // (ndim)
  int64_t* strides;  // (ndim) in elements; nullptr: row-major contiguous
  uint64_t byte_offset;
};

// Capsule name "dltensor" (DLPack < 1.0).
struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};

struct Version {
  uint32_t major;
  uint32_t minor;
};

constexpr uint64_t kFlagReadOnly = 1ull << 0;
constexpr uint64_t kFlagIsCopied = 1ull << 1;

// Capsule name "dltensor_versioned" (DLPack >= 1.0).
struct ManagedTensorVersioned {
  Version version;
  void* manager_ctx;
  void (*deleter)(ManagedTensorVersioned* self);
  uint64_t flags;
  Tensor dl_tensor;
};

// A consumer renames the capsule once it owns the tensor, so that the capsule's destructor does
// not call the deleter a second time.
constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";
constexpr const char* kVersionedCapsuleName = "dltensor_versioned";
constexpr const char* kUsedVersionedCapsuleName = "used_dltensor_versioned";

}  // namespace replayssm::python::dlpack
