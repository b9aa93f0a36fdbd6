#include "dlpack_import.hpp"

#include <cstring>
#include <sstream>
#include <string>

#include "dlpack.hpp"
#include "replayssm/error.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace replayssm::python {
namespace {

// Set by register_torch(). Raw references, never released at exit: a static nb::object would
// be destroyed after the interpreter has been finalised.
PyObject* g_torch_tensor_type = nullptr;  // torch.Tensor
PyObject* g_torch_to_dlpack = nullptr;    // torch._C._to_dlpack

template <typename... Args> [[noreturn]] void fail(const Args&... args) {
  std::ostringstream os;
  os << "replayssm: ";
  (os << ... << args);
  throw InvalidArgument(os.str());
}

std::string type_name_of(nb::handle obj) { return nb::type_name(obj.type()).c_str(); }

std::string message_of(const nb::python_error& e) {
  return std::string(nb::type_name(e.type()).c_str()) + ": " + nb::str(e.value()).c_str();
}

// The value __dlpack__(stream=...) takes for a cudaStream_t: DLPack reserves 0, and names the
// legacy default stream 1 and the per-thread default stream 2, as cudaStreamLegacy and
// cudaStreamPerThread do; any other stream is its handle.
int64_t dlpack_stream_code(uintptr_t stream) { return stream == 0 ? 1 : int64_t(stream); }

DType dtype_of(const dlpack::DataType& t, const char* name, bool bfloat16_as_uint16) {
  if (t.lanes != 1)
    fail(name, " has vector dtype lanes=", t.lanes, ": replayssm takes scalar dtypes");
  if (bfloat16_as_uint16 && t.code == dlpack::kUInt && t.bits == 16) return DType::kBFloat16;
  if (t.code == dlpack::kFloat && t.bits == 32) return DType::kFloat32;
  if (t.code == dlpack::kFloat && t.bits == 16) return DType::kFloat16;
  if (t.code == dlpack::kBfloat && t.bits == 16) return DType::kBFloat16;
  if (t.code == dlpack::kFloat && t.bits == 64) return DType::kFloat64;
  if (t.code == dlpack::kInt && t.bits == 32) return DType::kInt32;
  fail(name, " has DLPack dtype (code ", int(t.code), ", bits ", int(t.bits),
       "): replayssm takes float32, float16, bfloat16, float64 (reference state) and int32");
}

Device device_of(const dlpack::Device& d, const char* name) {
  switch (d.device_type) {
    case dlpack::kCpu: return Device{DeviceType::kCpu, 0};
    case dlpack::kCuda:
    case dlpack::kCudaManaged: return Device{DeviceType::kCuda, d.device_id};
    default:
      fail(name, " is on DLPack device type ", d.device_type,
           ": replayssm takes CPU (1) and CUDA (2) arrays");
  }
}

TensorView view_of(const dlpack::Tensor& t, const char* name, Access access, bool bfloat16_as_uint16) {
  TensorView v;
  if (t.ndim < 0 || t.ndim > kMaxRank)
    fail(name, " has rank ", t.ndim, ": replayssm takes at most rank ", kMaxRank);
  v.data = static_cast<char*>(t.data) + t.byte_offset;
  const bool bytes = access == Access::kScratch && t.dtype.lanes == 1 && t.dtype.bits == 8 &&
                     (t.dtype.code == dlpack::kInt || t.dtype.code == dlpack::kUInt);
  v.dtype = bytes ? DType::kInt8 : dtype_of(t.dtype, name, bfloat16_as_uint16);
  v.device = device_of(t.device, name);
  v.rank = t.ndim;
  int64_t contiguous_stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    v.shape[d] = t.shape[d];
    v.strides[d] = t.strides != nullptr ? t.strides[d] : contiguous_stride;
    contiguous_stride *= t.shape[d];
  }
  return v;
}

// numpy arrays of ml_dtypes.bfloat16 cannot be exported (DLPack in numpy knows only its own
// dtypes); the same memory viewed as uint16 can, and is read back as bfloat16.
bool is_bfloat16_extension_array(nb::handle array) {
  nb::object dtype = nb::getattr(array, "dtype", nb::none());
  if (dtype.is_none()) return false;
  nb::object dtype_name = nb::getattr(dtype, "name", nb::none());
  return nb::isinstance<nb::str>(dtype_name) &&
         std::strcmp(nb::str(dtype_name).c_str(), "bfloat16") == 0 && nb::hasattr(array, "view");
}

}  // namespace

void register_torch(nb::handle tensor_type, nb::handle to_dlpack) {
  if (!PyType_Check(tensor_type.ptr()) || !PyCallable_Check(to_dlpack.ptr()))
    throw nb::type_error("replayssm: register_torch takes torch.Tensor and torch._C._to_dlpack");
  Py_XSETREF(g_torch_tensor_type, tensor_type.inc_ref().ptr());
  Py_XSETREF(g_torch_to_dlpack, to_dlpack.inc_ref().ptr());
}

ImportedTensors::~ImportedTensors() {
  for (int i = 0; i < count_; ++i) {
    if (owned_[i].legacy != nullptr && owned_[i].legacy->deleter != nullptr)
      owned_[i].legacy->deleter(owned_[i].legacy);
    if (owned_[i].versioned != nullptr && owned_[i].versioned->deleter != nullptr)
      owned_[i].versioned->deleter(owned_[i].versioned);
  }
}

TensorView ImportedTensors::view(nb::handle array, const char* name, Access access) {
  if (array.is_none()) return {};
  bool bfloat16_as_uint16 = false;
  nb::object capsule = export_capsule(array, name, &bfloat16_as_uint16);
  return consume(capsule, name, access, bfloat16_as_uint16);
}

nb::object ImportedTensors::export_capsule(nb::handle array, const char* name,
                                           bool* bfloat16_as_uint16) {
  PyObject* obj = array.ptr();
  if (request_.torch_export_direct && g_torch_tensor_type != nullptr &&
      PyObject_TypeCheck(obj, reinterpret_cast<PyTypeObject*>(g_torch_tensor_type))) {
    PyObject* capsule = PyObject_CallOneArg(g_torch_to_dlpack, obj);
    if (capsule == nullptr) {
      nb::python_error e;
      fail(name, ": PyTorch could not export it through DLPack: ", message_of(e));
    }
    return nb::steal(capsule);
  }

  if (!nb::hasattr(array, "__dlpack__") || !nb::hasattr(array, "__dlpack_device__"))
    throw nb::type_error(("replayssm: " + std::string(name) +
                          " must be an array implementing __dlpack__ (numpy, PyTorch, CuPy, JAX), "
                          "got " + type_name_of(array))
                             .c_str());
  try {
    const int device_type = nb::cast<int>(array.attr("__dlpack_device__")()[0]);
    const bool cuda = device_type == dlpack::kCuda || device_type == dlpack::kCudaManaged;
    nb::object export_fn = array.attr("__dlpack__");
    try {
      if (cuda)
        return export_fn("stream"_a = dlpack_stream_code(request_.launch_stream),
                         "max_version"_a = nb::make_tuple(1, 0));
      return export_fn("max_version"_a = nb::make_tuple(1, 0));
    } catch (nb::python_error& e) {
      // A producer older than DLPack 1.0 knows no max_version: ask for the legacy capsule.
      if (!e.matches(PyExc_TypeError)) throw;
    }
    if (cuda) return export_fn("stream"_a = dlpack_stream_code(request_.launch_stream));
    return export_fn();
  } catch (nb::python_error& e) {
    if (e.matches(PyExc_BufferError) && !*bfloat16_as_uint16 &&
        is_bfloat16_extension_array(array)) {
      *bfloat16_as_uint16 = true;
      nb::object bits = array.attr("view")("uint16");
      return export_capsule(bits, name, bfloat16_as_uint16);
    }
    fail(name, ": __dlpack__() failed: ", message_of(e));
  }
}

TensorView ImportedTensors::consume(nb::handle capsule, const char* name, Access access,
                                    bool bfloat16_as_uint16) {
  PyObject* cap = capsule.ptr();
  if (!PyCapsule_CheckExact(cap))
    fail(name, ": __dlpack__() returned a ", type_name_of(capsule), ", not a DLPack capsule");
  if (count_ == kMaxTensors) fail("one call imports at most ", kMaxTensors, " tensors");
  const char* capsule_name = PyCapsule_GetName(cap);
  if (capsule_name != nullptr && std::strcmp(capsule_name, dlpack::kVersionedCapsuleName) == 0) {
    auto* managed = static_cast<dlpack::ManagedTensorVersioned*>(
        PyCapsule_GetPointer(cap, dlpack::kVersionedCapsuleName));
    if (managed->version.major != 1)
      fail(name, " was exported with DLPack ", managed->version.major, ".", managed->version.minor,
           ": replayssm reads DLPack 1.x");
    PyCapsule_SetName(cap, dlpack::kUsedVersionedCapsuleName);
    owned_[count_++].versioned = managed;
    if (access != Access::kRead && (managed->flags & dlpack::kFlagReadOnly))
      fail(name, " is read-only, but this call writes it in place: pass a writable array");
    if (access != Access::kRead && (managed->flags & dlpack::kFlagIsCopied))
      fail(name, " was exported as a copy, but this call writes it in place: pass an array the "
           "producer can share without copying");
    return view_of(managed->dl_tensor, name, access, bfloat16_as_uint16);
  }
  if (capsule_name != nullptr && std::strcmp(capsule_name, dlpack::kCapsuleName) == 0) {
    auto* managed =
        static_cast<dlpack::ManagedTensor*>(PyCapsule_GetPointer(cap, dlpack::kCapsuleName));
    PyCapsule_SetName(cap, dlpack::kUsedCapsuleName);
    owned_[count_++].legacy = managed;
    return view_of(managed->dl_tensor, name, access, bfloat16_as_uint16);
  }
  fail(name, ": the capsule is named \"", capsule_name != nullptr ? capsule_name : "",
       "\", not an unconsumed \"dltensor\" or \"dltensor_versioned\"");
}

}  // namespace replayssm::python
