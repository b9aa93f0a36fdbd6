// Python arrays in, replayssm::TensorView out: the DLPack consumer of the binding. Zero-copy: a
// view points at the producer's memory, which stays alive until the call's ImportedTensors dies.
#pragma once

#include <array>
#include <cstdint>

#include <nanobind/nanobind.h>

#include "replayssm/tensor.hpp"

namespace replayssm::python {

namespace dlpack {
struct ManagedTensor;
struct ManagedTensorVersioned;
}  // namespace dlpack

// What one call tells the producers of its tensors.
struct ExportRequest {
  // The cudaStream_t the call launches on (0: the legacy default stream). CUDA producers are
  // asked, through __dlpack__(stream=...), to order their pending work before it.
  uintptr_t launch_stream = 0;
  // PyTorch tensors need no ordering: they are on the CPU or the launch stream is PyTorch's
  // current stream. They are then exported without the Python-level __dlpack__ wrapper.
  bool torch_export_direct = false;
};

// kScratch: written, and only its bytes matter (a workspace): 8-bit integer arrays (int8, uint8)
// are taken too, as bytes.
enum class Access { kRead, kWrite, kScratch };

// Registers PyTorch's tensor type and its C-level DLPack exporter (torch._C._to_dlpack); the
// binding never imports torch itself. The references are kept until a later call replaces them.
void register_torch(nanobind::handle tensor_type, nanobind::handle to_dlpack);

// The tensors of one call. Each producer's deleter runs when this object is destroyed, which
// must happen with the GIL held (producers such as numpy release Python references).
class ImportedTensors {
 public:
  explicit ImportedTensors(const ExportRequest& request) : request_(request) {}
  ~ImportedTensors();
  ImportedTensors(const ImportedTensors&) = delete;
  ImportedTensors& operator=(const ImportedTensors&) = delete;

  // A view of `array` (any object implementing __dlpack__); None gives an absent (empty) view.
  // `name` is the argument's name in error messages; kWrite refuses read-only or copied exports.
  TensorView view(nanobind::handle array, const char* name, Access access);

 private:
  nanobind::object export_capsule(nanobind::handle array, const char* name,
                                  bool* bfloat16_as_uint16);
  TensorView consume(nanobind::handle capsule, const char* name, Access access,
                     bool bfloat16_as_uint16);

  // One entry per imported tensor; exactly one pointer of each pair is set.
  struct Owned {
    dlpack::ManagedTensor* legacy = nullptr;
    dlpack::ManagedTensorVersioned* versioned = nullptr;
  };
  static constexpr int kMaxTensors = 16;  // the most tensors one entry point takes

  ExportRequest request_;
  std::array<Owned, kMaxTensors> owned_{};
  int count_ = 0;
};

}  // namespace replayssm::python
