// Argument checks shared by the validation of every entry point (validate.cpp, validate_spec.cpp).
// Each throws InvalidArgument naming the argument and the numbers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "api/params.hpp"

namespace replayssm {

constexpr int64_t kMaxBufferLen = 64;

// Messages are built with std::to_string rather than iostreams: independent of the global locale
// (no "1,048,576"), and of the locale machinery of whichever C++ runtime the host process loaded.
inline void append(std::string& message, const char* text) { message += text; }
inline void append(std::string& message, const std::string& text) { message += text; }
template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
void append(std::string& message, T value) {
  message += std::to_string(value);
}

template <typename... Args> [[noreturn]] void fail(const Args&... args) {
  std::string message = "replayssm: ";
  (append(message, args), ...);
  throw InvalidArgument(message);
}

inline std::string shape_string(const TensorView& t) {
  std::string text = "(";
  for (int d = 0; d < t.rank; ++d) text += (d ? ", " : "") + std::to_string(t.shape[d]);
  return text + ")";
}

inline void require_defined(const TensorView& t, const char* name) {
  if (!t.defined()) fail(name, " is required but was not given");
}

inline void require_rank(const TensorView& t, const char* name, int rank, const char* layout) {
  if (t.rank != rank)
    fail(name, " must have rank ", rank, " ", layout, ", got rank ", t.rank, " with shape ",
         shape_string(t));
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] < 0) fail(name, ".size(", d, ")=", t.shape[d], " must not be negative");
    if (t.strides[d] < 0) fail(name, ".stride(", d, ")=", t.strides[d], " must not be negative");
  }
}

inline void require_size(const TensorView& t, const char* name, int dim, int64_t expected,
                                const char* what) {
  if (t.shape[dim] != expected)
    fail(name, ".size(", dim, ")=", t.shape[dim], " must equal ", what, "=", expected);
}

inline void require_dtype(const TensorView& t, const char* name, DType expected, const char* what) {
  if (t.dtype != expected)
    fail(name, " has dtype ", dtype_name(t.dtype), " but must be ", dtype_name(expected), " (",
         what, ")");
}

inline void require_float16_32(const TensorView& t, const char* name) {
  if (t.dtype != DType::kFloat32 && t.dtype != DType::kFloat16 && t.dtype != DType::kBFloat16)
    fail(name, " has dtype ", dtype_name(t.dtype), " but must be float32, float16 or bfloat16");
}

// The last axis must be contiguous (a size-1 axis has no meaningful stride).
inline void require_last_contiguous(const TensorView& t, const char* name) {
  const int d = t.rank - 1;
  if (t.shape[d] > 1 && t.strides[d] != 1)
    fail(name, ".stride(", d, ")=", t.strides[d], " must be 1 (last axis contiguous)");
}

// Axes that a per-head scalar is broadcast over must have stride 0 (or size 1).
inline void require_broadcast(const TensorView& t, const char* name, int first_dim) {
  for (int d = first_dim; d < t.rank; ++d)
    if (t.shape[d] > 1 && t.strides[d] != 0)
      fail(name, " must be a per-head scalar: ", name, ".stride(", d, ")=", t.strides[d],
           " must be 0 (broadcast over size ", t.shape[d], ")");
}

// A per-head scalar given as (H), (H, P) or (H, P, N) with zero strides past the head axis.
inline HeadScalar head_scalar(const TensorView& t, const char* name, int64_t nheads, int64_t head_dim,
                              int64_t state_dim, int max_rank) {
  if (!t.defined()) return {};
  if (t.rank < 1 || t.rank > max_rank)
    fail(name, " must have rank 1 (H)", max_rank >= 2 ? " or 2 (H, P)" : "",
         max_rank >= 3 ? " or 3 (H, P, N)" : "", ", got rank ", t.rank, " with shape ",
         shape_string(t));
  require_rank(t, name, t.rank, "");
  require_size(t, name, 0, nheads, "nheads");
  if (t.rank >= 2) require_size(t, name, 1, head_dim, "head_dim");
  if (t.rank >= 3) require_size(t, name, 2, state_dim, "state_dim");
  require_float16_32(t, name);
  require_broadcast(t, name, 1);
  return HeadScalar{t.data, t.dtype, t.strides[0]};
}

inline bool same_device(Device a, Device b) {
  return a.type == b.type && (a.type == DeviceType::kCpu || a.index == b.index);
}

// Every tensor of a call lives on one device, the one its backend runs on.
class DeviceCheck {
 public:
  DeviceCheck(const TensorView& anchor, const char* anchor_name, Backend backend)
      : anchor_(anchor.device), anchor_name_(anchor_name) {
    const bool cuda = anchor.device.type == DeviceType::kCuda;
    if (backend == Backend::kCuda && !cuda)
      fail("the CUDA backend needs CUDA tensors, but ", anchor_name, " is on the CPU");
    if (backend != Backend::kCuda && cuda)
      fail("the ", backend_name(backend), " backend needs CPU tensors, but ", anchor_name,
           " is on cuda:", anchor.device.index);
  }
  void operator()(const TensorView& t, const char* name) const {
    if (t.defined() && !same_device(t.device, anchor_))
      fail(name, " is on ", device_name(t.device.type), ":", t.device.index, " but ", anchor_name_,
           " is on ", device_name(anchor_.type), ":", anchor_.index);
  }

 private:
  Device anchor_;
  const char* anchor_name_;
};

// Bytes a strided tensor may touch: [lo, lo + row_span) repeated every outer stride along dim 0.
struct Footprint {
  const char* name;
  uintptr_t lo = 0, hi = 0;  // whole extent
  int64_t outer_stride = 0;  // bytes between dim-0 entries
  int64_t row_span = 0;      // bytes one dim-0 entry spans
};

inline Footprint footprint(const TensorView& t, const char* name) {
  Footprint f{name};
  const int64_t es = dtype_size(t.dtype);
  if (t.numel() == 0) return f;
  int64_t inner = 0;
  for (int d = 1; d < t.rank; ++d) inner += (t.shape[d] - 1) * t.strides[d];
  f.row_span = (inner + 1) * es;
  f.outer_stride = t.rank > 0 ? t.strides[0] * es : 0;
  const int64_t outer = t.rank > 0 ? (t.shape[0] - 1) * t.strides[0] * es : 0;
  f.lo = reinterpret_cast<uintptr_t>(t.data);
  f.hi = f.lo + uintptr_t(outer + f.row_span);
  return f;
}

inline bool overlaps(const Footprint& a, const Footprint& b) {
  if (a.lo == a.hi || b.lo == b.hi || a.hi <= b.lo || b.hi <= a.lo) return false;
  // Views that interleave row by row in one buffer (x, B and C as column slices of one xBC
  // projection) share their extents but no element: same outer stride, disjoint rows modulo it.
  const int64_t R = a.outer_stride;
  if (R > 0 && R == b.outer_stride && a.row_span <= R && b.row_span <= R) {
    const int64_t diff = int64_t(b.lo) - int64_t(a.lo);
    const int64_t offset = (diff % R + R) % R;  // where b's rows start inside a's row period
    if (a.row_span <= offset && offset + b.row_span <= R) return false;
  }
  return true;
}

// Written tensors must not share memory with each other or with any input.
inline void require_no_aliasing(const std::vector<std::pair<const TensorView*, const char*>>& written,
                                const std::vector<std::pair<const TensorView*, const char*>>& read) {
  std::vector<Footprint> w, r;
  for (auto& [t, name] : written)
    if (t->defined()) w.push_back(footprint(*t, name));
  for (auto& [t, name] : read)
    if (t->defined()) r.push_back(footprint(*t, name));
  for (size_t i = 0; i < w.size(); ++i) {
    for (size_t j = i + 1; j < w.size(); ++j)
      if (overlaps(w[i], w[j])) fail(w[i].name, " and ", w[j].name, " overlap in memory");
    for (auto& f : r)
      if (overlaps(w[i], f)) fail(w[i].name, " (written) overlaps ", f.name, " in memory");
  }
}

inline bool host_readable(const TensorView& t) { return t.defined() && t.device.type == DeviceType::kCpu; }

// The CUDA workspace (ExecOptions::workspace) of a call that needs `needed` bytes (`sizes` names
// the call's sizes that set it, `query` the function that computes it): checked when the CUDA
// backend runs the call, the only one that uses it. nullptr when there is none to use.
inline float* checked_workspace(const TensorView& workspace, const DeviceCheck& same_device_as_state,
                                Backend backend, int64_t needed, const std::string& sizes,
                                const char* query) {
  if (backend != Backend::kCuda || !workspace.defined()) return nullptr;
  same_device_as_state(workspace, "workspace");
  require_rank(workspace, "workspace", 1, "(bytes / element size), contiguous");
  require_last_contiguous(workspace, "workspace");
  const int64_t bytes = workspace.numel() * dtype_size(workspace.dtype);
  if (bytes < needed) fail("workspace holds ", bytes, " bytes but ", sizes, " need ", needed, " (", query, ")");
  if (reinterpret_cast<uintptr_t>(workspace.data) % 16 != 0)
    fail("workspace must be 16-byte aligned, but its address ends in ",
         int64_t(reinterpret_cast<uintptr_t>(workspace.data) % 16), " mod 16");
  return static_cast<float*>(workspace.data);
}

// The input caches of a slot (x, B and raw dt at `positions` positions each, the buffer of
// standard decode or the ring of speculative decoding): ranks, sizes, dtypes, contiguity.
// `axis` names the position axis in the layouts ("L" or "R"), `positions_from` where its size
// comes from, `ngroups_from` where the number of groups does.
struct InputCacheShape {
  int64_t slots, nheads, head_dim, ngroups, state_dim, positions;
  DType act_dtype;
  const char* axis;
  const char* positions_from;
  const char* ngroups_from;
};

inline void require_input_caches(const TensorView& x_cache, const TensorView& B_cache,
                                 const TensorView& dt_cache, const InputCacheShape& s) {
  const std::string axis = s.axis;
  require_rank(x_cache, "x_cache", 4, ("(slots, nheads, " + axis + ", head_dim)").c_str());
  require_size(x_cache, "x_cache", 0, s.slots, "slots (state.size(0))");
  require_size(x_cache, "x_cache", 1, s.nheads, "nheads");
  require_size(x_cache, "x_cache", 2, s.positions, s.positions_from);
  require_size(x_cache, "x_cache", 3, s.head_dim, "head_dim");
  require_dtype(x_cache, "x_cache", s.act_dtype, "the dtype of x");
  require_last_contiguous(x_cache, "x_cache");

  require_rank(B_cache, "B_cache", 4, ("(slots, ngroups, " + axis + ", state_dim)").c_str());
  require_size(B_cache, "B_cache", 0, s.slots, "slots (state.size(0))");
  require_size(B_cache, "B_cache", 1, s.ngroups, s.ngroups_from);
  require_size(B_cache, "B_cache", 2, s.positions, s.positions_from);
  require_size(B_cache, "B_cache", 3, s.state_dim, "state_dim");
  require_dtype(B_cache, "B_cache", s.act_dtype, "the dtype of x");
  require_last_contiguous(B_cache, "B_cache");

  require_rank(dt_cache, "dt_cache", 3, ("(slots, nheads, " + axis + ")").c_str());
  require_size(dt_cache, "dt_cache", 0, s.slots, "slots (state.size(0))");
  require_size(dt_cache, "dt_cache", 1, s.nheads, "nheads");
  require_size(dt_cache, "dt_cache", 2, s.positions, s.positions_from);
  require_dtype(dt_cache, "dt_cache", DType::kFloat32, "raw dt widened to float32");
  require_last_contiguous(dt_cache, "dt_cache");
}

// Slot indices live on the host for CPU backends: check them before anything is written.
inline void check_slot_values(const int32_t* ids, int64_t stride, int64_t count, int64_t slots,
                              int64_t pad_slot_id, const char* name, bool unique) {
  std::vector<int32_t> seen;
  for (int64_t i = 0; i < count; ++i) {
    const int32_t s = ids[i * stride];
    if (s == pad_slot_id) continue;
    if (s < 0 || s >= slots)
      fail(name, "[", i, "]=", s, " is out of range: must be in [0, ", slots,
           ") or equal pad_slot_id=", pad_slot_id);
    if (unique) seen.push_back(s);
  }
  std::sort(seen.begin(), seen.end());
  const auto dup = std::adjacent_find(seen.begin(), seen.end());
  if (dup != seen.end())
    fail(name, " maps two rows to slot ", *dup, ": rows of one call must use distinct slots");
}

// An optional (n) int32 list of distinct slot ids (the rows of a cursor or ring update) into the
// slots of `owner`, the tensor the update writes: absent, the update covers every slot.
struct SlotIdList {
  const int32_t* ids = nullptr;  // (count), or nullptr: slot i for i < count
  int64_t stride = 1;
  int64_t count = 0;
};

inline SlotIdList slot_id_list(const TensorView& ids, const char* name, const TensorView& owner,
                               const char* owner_name, int64_t slots, int64_t pad_slot_id) {
  SlotIdList list;
  list.count = slots;
  if (!ids.defined()) return list;
  require_rank(ids, name, 1, "(n)");
  require_dtype(ids, name, DType::kInt32, "slot indices");
  require_no_aliasing({{&owner, owner_name}}, {{&ids, name}});
  list.ids = ids.ptr<const int32_t>();
  list.stride = ids.strides[0];
  list.count = ids.shape[0];
  if (host_readable(ids)) check_slot_values(list.ids, list.stride, list.count, slots, pad_slot_id, name, true);
  return list;
}

}  // namespace replayssm
