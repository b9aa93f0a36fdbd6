#include "api/validate_spec.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "api/checks.hpp"

namespace replayssm {
namespace {

using Named = std::pair<const TensorView*, const char*>;

std::vector<Named> window_inputs(const Mamba2Window& w) {
  return {{&w.x, "x"},  {&w.dt, "dt"}, {&w.A, "A"},
          {&w.B, "B"},  {&w.C, "C"},   {&w.D, "D"},
          {&w.z, "z"},  {&w.dt_bias, "dt_bias"}, {&w.num_valid_tokens, "num_valid_tokens"},
          {&w.state_batch_indices, "state_batch_indices"}};
}

void check_window_len(int64_t window, const char* name) {
  if (window < 1 || window > kMaxSpecWindow)
    fail(name, "=", window, " (T, tokens per verify window) must be in [1, ", kMaxSpecWindow, "]");
}

// (batch, T, heads or groups, channels), the dtype of x, last axis contiguous.
void require_window_tensor(const TensorView& t, const char* name, const char* layout,
                           const WindowParams& p, int64_t heads, const char* heads_what,
                           int64_t channels, const char* channels_what) {
  require_rank(t, name, 4, layout);
  require_size(t, name, 0, p.batch, "batch (x.size(0))");
  require_size(t, name, 1, p.window, "T (x.size(1))");
  require_size(t, name, 2, heads, heads_what);
  require_size(t, name, 3, channels, channels_what);
  require_dtype(t, name, p.act_dtype, "the dtype of x");
  require_last_contiguous(t, name);
}

// Everything a window call shares: the state (checkpoint or baseline state) and the window.
// `slot_rank` is the rank of state_batch_indices: 1 (batch) for ReplaySSM, 2 (batch, T) for the
// baseline, where it is required.
WindowParams validate_window(const TensorView& state, const Mamba2Window& w, Backend backend,
                             int slot_rank) {
  require_defined(state, "state");
  for (auto [t, name] : {Named{&w.x, "x"}, {&w.dt, "dt"}, {&w.A, "A"}, {&w.B, "B"}, {&w.C, "C"},
                         {&w.out, "out"}})
    require_defined(*t, name);
  if (slot_rank == 2) require_defined(w.state_batch_indices, "state_batch_indices");

  const DeviceCheck same_device_as_state(state, "state", backend);
  for (auto [t, name] : window_inputs(w)) same_device_as_state(*t, name);
  same_device_as_state(w.out, "out");

  require_rank(state, "state", 4, "(slots, nheads, head_dim, state_dim)");
  WindowParams p;
  p.slots = state.shape[0];
  p.nheads = state.shape[1];
  p.head_dim = state.shape[2];
  p.state_dim = state.shape[3];
  if (p.nheads < 1 || p.head_dim < 1 || p.state_dim < 1)
    fail("state ", shape_string(state), " must have nheads, head_dim and state_dim >= 1");
  if (state.dtype == DType::kFloat64) {
    if (backend != Backend::kReference)
      fail("state has dtype float64, which only the reference backend accepts (backend is ",
           backend_name(backend), ")");
  } else {
    require_float16_32(state, "state");
  }
  require_last_contiguous(state, "state");

  require_rank(w.x, "x", 4, "(batch, T, nheads, head_dim)");
  p.batch = w.x.shape[0];
  p.window = w.x.shape[1];
  check_window_len(p.window, "x.size(1)");
  require_size(w.x, "x", 2, p.nheads, "nheads (state.size(1))");
  require_size(w.x, "x", 3, p.head_dim, "head_dim (state.size(2))");
  require_float16_32(w.x, "x");
  require_last_contiguous(w.x, "x");
  p.act_dtype = w.x.dtype;

  require_rank(w.B, "B", 4, "(batch, T, ngroups, state_dim)");
  p.ngroups = w.B.shape[2];
  if (p.ngroups < 1 || p.nheads % p.ngroups != 0)
    fail("B.size(2)=", p.ngroups, " (ngroups) must divide nheads=", p.nheads);
  p.heads_per_group = p.nheads / p.ngroups;
  require_window_tensor(w.B, "B", "(batch, T, ngroups, state_dim)", p, p.ngroups, "ngroups",
                        p.state_dim, "state_dim (state.size(3))");
  require_window_tensor(w.C, "C", "(batch, T, ngroups, state_dim)", p, p.ngroups,
                        "ngroups (B.size(2))", p.state_dim, "state_dim (state.size(3))");

  if (w.dt.rank != 3 && w.dt.rank != 4)
    fail("dt must have rank 3 (batch, T, nheads) or 4 (batch, T, nheads, head_dim), got rank ",
         w.dt.rank, " with shape ", shape_string(w.dt));
  require_rank(w.dt, "dt", w.dt.rank, "");
  require_size(w.dt, "dt", 0, p.batch, "batch (x.size(0))");
  require_size(w.dt, "dt", 1, p.window, "T (x.size(1))");
  require_size(w.dt, "dt", 2, p.nheads, "nheads");
  if (w.dt.rank == 4) {
    require_size(w.dt, "dt", 3, p.head_dim, "head_dim");
    require_broadcast(w.dt, "dt", 3);
  }
  if (w.dt.dtype != p.act_dtype && w.dt.dtype != DType::kFloat32)
    fail("dt has dtype ", dtype_name(w.dt.dtype), " but must be float32 or the dtype of x (",
         dtype_name(p.act_dtype), ")");
  p.dt_dtype = w.dt.dtype;

  p.A = head_scalar(w.A, "A", p.nheads, p.head_dim, p.state_dim, 3);
  p.D = head_scalar(w.D, "D", p.nheads, p.head_dim, p.state_dim, 2);
  p.dt_bias = head_scalar(w.dt_bias, "dt_bias", p.nheads, p.head_dim, p.state_dim, 2);
  p.dt_softplus = w.dt_softplus;

  if (w.z.defined())
    require_window_tensor(w.z, "z", "(batch, T, nheads, head_dim)", p, p.nheads, "nheads",
                          p.head_dim, "head_dim");
  require_window_tensor(w.out, "out", "(batch, T, nheads, head_dim)", p, p.nheads, "nheads",
                        p.head_dim, "head_dim");

  const TensorView& valid = w.num_valid_tokens;
  if (valid.defined()) {
    require_rank(valid, "num_valid_tokens", 1, "(batch)");
    require_size(valid, "num_valid_tokens", 0, p.batch, "batch (x.size(0))");
    require_dtype(valid, "num_valid_tokens", DType::kInt32, "tokens per row");
    p.num_valid_tokens = valid.ptr<const int32_t>();
    p.num_valid_tokens_stride = valid.strides[0];
    if (host_readable(valid))
      for (int64_t row = 0; row < p.batch; ++row) {
        const int32_t n = p.num_valid_tokens[row * p.num_valid_tokens_stride];
        if (n < 1 || n > p.window)
          fail("num_valid_tokens[", row, "]=", n, " is out of range: must be in [1, T=", p.window,
               "]");
      }
  }

  const TensorView& sbi = w.state_batch_indices;
  if (sbi.defined()) {
    if (slot_rank == 1) {
      require_rank(sbi, "state_batch_indices", 1, "(batch)");
    } else {
      require_rank(sbi, "state_batch_indices", 2, "(batch, T)");
      require_size(sbi, "state_batch_indices", 1, p.window, "T (x.size(1))");
    }
    require_size(sbi, "state_batch_indices", 0, p.batch, "batch (x.size(0))");
    require_dtype(sbi, "state_batch_indices", DType::kInt32, "slot indices");
    p.state_batch_indices = sbi.ptr<const int32_t>();
    p.state_batch_indices_stride = sbi.strides[0];
  } else if (p.batch > p.slots) {
    fail("x.size(0)=", p.batch, " (batch) exceeds state.size(0)=", p.slots,
         " (slots); pass state_batch_indices to map rows to slots");
  }
  p.pad_slot_id = w.pad_slot_id;

  p.x = w.x.data;
  p.x_stride_batch = w.x.strides[0];
  p.x_stride_token = w.x.strides[1];
  p.x_stride_head = w.x.strides[2];
  p.dt = w.dt.data;
  p.dt_stride_batch = w.dt.strides[0];
  p.dt_stride_token = w.dt.strides[1];
  p.dt_stride_head = w.dt.strides[2];
  p.B = w.B.data;
  p.B_stride_batch = w.B.strides[0];
  p.B_stride_token = w.B.strides[1];
  p.B_stride_group = w.B.strides[2];
  p.C = w.C.data;
  p.C_stride_batch = w.C.strides[0];
  p.C_stride_token = w.C.strides[1];
  p.C_stride_group = w.C.strides[2];
  p.z = w.z.data;
  p.z_stride_batch = w.z.defined() ? w.z.strides[0] : 0;
  p.z_stride_token = w.z.defined() ? w.z.strides[1] : 0;
  p.z_stride_head = w.z.defined() ? w.z.strides[2] : 0;
  p.out = w.out.data;
  p.out_stride_batch = w.out.strides[0];
  p.out_stride_token = w.out.strides[1];
  p.out_stride_head = w.out.strides[2];
  p.device_index = state.device.index;
  p.state = state.data;
  p.state_dtype = state.dtype;
  p.state_stride_slot = state.strides[0];
  p.state_stride_head = state.strides[1];
  p.state_stride_p = state.strides[2];
  return p;
}

// The ring tensor (slots, 2) int32 shared by verify, commit and reset.
void require_ring(const TensorView& ring, int64_t slots, const char* slots_what) {
  require_rank(ring, "ring", 2, "(slots, 2): origin, committed");
  if (slots >= 0) require_size(ring, "ring", 0, slots, slots_what);
  require_size(ring, "ring", 1, 2, "2 (origin, committed)");
  require_dtype(ring, "ring", DType::kInt32, "ring origin and committed count per slot");
}

// Host rings (CPU backends): every slot a call reads keeps the ring invariant.
void check_ring_value(const TensorView& ring, int64_t slot, int64_t row, int64_t window,
                      int64_t buffer_len, int64_t ring_len) {
  const int32_t* r = ring.ptr<const int32_t>() + slot * ring.strides[0];
  const int32_t origin = r[0], committed = r[ring.strides[1]];
  if (origin < 0 || origin >= ring_len || committed < 0 || committed > buffer_len - window)
    fail("ring[", slot, "]=(", origin, ", ", committed, ") (row ", row,
         ") is out of range: origin must be in [0, R=", ring_len, ") and committed in [0, L - T=",
         buffer_len - window, "]");
}

// Slot of a row under a (batch) state_batch_indices (absent: the row), or -1 for a pad row.
int64_t row_slot(const int32_t* ids, int64_t stride, int64_t row, int64_t pad_slot_id) {
  if (ids == nullptr) return row;
  const int64_t slot = ids[row * stride];
  return slot == pad_slot_id ? -1 : slot;
}

void check_accepted_values(const int32_t* accepted, int64_t stride, int64_t count, int64_t window,
                           const int32_t* ids, int64_t ids_stride, int64_t pad_slot_id) {
  for (int64_t row = 0; row < count; ++row) {
    if (row_slot(ids, ids_stride, row, pad_slot_id) < 0) continue;
    const int32_t k = accepted[row * stride];
    if (k < 1 || k > window)
      fail("num_accepted_tokens[", row, "]=", k, " is out of range: must be in [1, T=", window, "]");
  }
}

// Baseline slots on the host: the valid positions and the source column of every non-pad row
// name slots in range, and no slot serves two rows or two positions.
void check_baseline_slots(const SpecBaselineParams& p) {
  std::vector<int32_t> used;
  for (int64_t row = 0; row < p.batch; ++row) {
    if (slot_of_row(p, row) < 0) continue;
    const int64_t source = p.num_accepted_tokens[row * p.num_accepted_tokens_stride] - 1;
    const int64_t n = valid_tokens(p, row);
    for (int64_t t = 0; t < p.window; ++t) {
      if (t >= n && t != source) continue;
      const int64_t s = baseline_slot(p, row, t);
      if (s < 0 || s >= p.slots)
        fail("state_batch_indices[", row, ", ", t, "]=", s, " is out of range: must be in [0, ",
             p.slots, ")", t == source ? " (the accepted position of the previous window)" : "");
      used.push_back(int32_t(s));
    }
  }
  std::sort(used.begin(), used.end());
  const auto dup = std::adjacent_find(used.begin(), used.end());
  if (dup != used.end())
    fail("state_batch_indices maps two positions to slot ", *dup,
         ": the slots of one call must be distinct");
}

}  // namespace

int64_t spec_ring_len(int64_t buffer_len, int64_t window) {
  check_window_len(window, "window");
  if (buffer_len < 2 * window || buffer_len > kMaxBufferLen)
    fail("buffer_len=", buffer_len, " (L) must be in [2 x window=", 2 * window, ", ", kMaxBufferLen,
         "]: the ring holds the committed history plus one window");
  int64_t ring_len = 1;
  while (ring_len < buffer_len) ring_len *= 2;
  return ring_len;
}

SpecVerifyParams validate_spec_verify(const SpecCache& c, const Mamba2Window& w, int64_t buffer_len,
                                      Backend backend, const ExecOptions& options) {
  SpecVerifyParams p;
  static_cast<WindowParams&>(p) = validate_window(c.state, w, backend, 1);
  p.buffer_len = buffer_len;
  p.ring_len = spec_ring_len(buffer_len, p.window);
  const DeviceCheck same_device_as_state(c.state, "state", backend);
  for (auto [t, name] : {Named{&c.x_cache, "x_cache"}, {&c.B_cache, "B_cache"},
                         {&c.dt_cache, "dt_cache"}, {&c.ring, "ring"}}) {
    require_defined(*t, name);
    same_device_as_state(*t, name);
  }

  require_input_caches(c.x_cache, c.B_cache, c.dt_cache,
                       {p.slots, p.nheads, p.head_dim, p.ngroups, p.state_dim, p.ring_len, p.act_dtype,
                        "R", "R (spec_ring_len(L, T))", "ngroups (B.size(2))"});

  require_ring(c.ring, p.slots, "slots (state.size(0))");

  const TensorView& workspace = options.workspace;
  p.workspace = checked_workspace(
      workspace, same_device_as_state, backend,
      spec_verify_workspace_bytes(p.batch, p.window, p.nheads, p.head_dim),
      "batch=" + std::to_string(p.batch) + ", window=" + std::to_string(p.window) +
          ", nheads=" + std::to_string(p.nheads) + ", head_dim=" + std::to_string(p.head_dim),
      "spec_verify_workspace_bytes");
  p.window_kernel = options.window_kernel;

  std::vector<Named> read = window_inputs(w);
  read.push_back({&c.ring, "ring"});
  const TensorView no_tensor;
  require_no_aliasing({{&c.state, "state"}, {&w.out, "out"}, {&c.x_cache, "x_cache"},
                       {&c.B_cache, "B_cache"}, {&c.dt_cache, "dt_cache"},
                       {p.workspace ? &workspace : &no_tensor, "workspace"}},
                      read);
  if (host_readable(w.state_batch_indices))
    check_slot_values(p.state_batch_indices, p.state_batch_indices_stride, p.batch, p.slots,
                      p.pad_slot_id, "state_batch_indices", true);
  if (host_readable(c.ring))
    for (int64_t row = 0; row < p.batch; ++row) {
      const int64_t slot = slot_of_row(p, row);
      if (slot >= 0) check_ring_value(c.ring, slot, row, p.window, p.buffer_len, p.ring_len);
    }

  p.x_cache = c.x_cache.data;
  p.xc_stride_slot = c.x_cache.strides[0];
  p.xc_stride_head = c.x_cache.strides[1];
  p.xc_stride_pos = c.x_cache.strides[2];
  p.B_cache = c.B_cache.data;
  p.Bc_stride_slot = c.B_cache.strides[0];
  p.Bc_stride_group = c.B_cache.strides[1];
  p.Bc_stride_pos = c.B_cache.strides[2];
  p.dt_cache = c.dt_cache.ptr<float>();
  p.dtc_stride_slot = c.dt_cache.strides[0];
  p.dtc_stride_head = c.dt_cache.strides[1];
  p.ring = c.ring.ptr<const int32_t>();
  p.ring_stride_slot = c.ring.strides[0];
  p.ring_stride_field = c.ring.strides[1];
  return p;
}

SpecBaselineParams validate_spec_state_update(const TensorView& state, const Mamba2Window& w,
                                              const TensorView& accepted, Backend backend) {
  SpecBaselineParams p;
  static_cast<WindowParams&>(p) = validate_window(state, w, backend, 2);
  require_defined(accepted, "num_accepted_tokens");
  const DeviceCheck same_device_as_state(state, "state", backend);
  same_device_as_state(accepted, "num_accepted_tokens");
  require_rank(accepted, "num_accepted_tokens", 1, "(batch)");
  require_size(accepted, "num_accepted_tokens", 0, p.batch, "batch (x.size(0))");
  require_dtype(accepted, "num_accepted_tokens", DType::kInt32, "accepted tokens per row");
  p.state_batch_indices_stride_token = w.state_batch_indices.strides[1];
  p.num_accepted_tokens = accepted.ptr<const int32_t>();
  p.num_accepted_tokens_stride = accepted.strides[0];

  std::vector<Named> read = window_inputs(w);
  read.push_back({&accepted, "num_accepted_tokens"});
  require_no_aliasing({{&state, "state"}, {&w.out, "out"}}, read);
  if (host_readable(accepted))
    check_accepted_values(p.num_accepted_tokens, p.num_accepted_tokens_stride, p.batch, p.window,
                          p.state_batch_indices, p.state_batch_indices_stride, p.pad_slot_id);
  if (host_readable(w.state_batch_indices)) check_baseline_slots(p);
  return p;
}

namespace {

SpecRingParams ring_params(const TensorView& ring, const TensorView& ids, const char* ids_name,
                           int64_t pad_slot_id, Backend backend) {
  require_defined(ring, "ring");
  const DeviceCheck same_device_as_ring(ring, "ring", backend);
  same_device_as_ring(ids, ids_name);
  require_ring(ring, -1, "");
  SpecRingParams p;
  p.device_index = ring.device.index;
  p.ring = ring.ptr<int32_t>();
  p.ring_stride_slot = ring.strides[0];
  p.ring_stride_field = ring.strides[1];
  p.slots = ring.shape[0];
  p.pad_slot_id = pad_slot_id;
  const SlotIdList list = slot_id_list(ids, ids_name, ring, "ring", p.slots, pad_slot_id);
  p.slot_ids = list.ids;
  p.slot_ids_stride = list.stride;
  p.count = list.count;
  return p;
}

}  // namespace

SpecRingParams validate_spec_commit(const TensorView& ring, const TensorView& accepted,
                                    int64_t window, int64_t buffer_len,
                                    const TensorView& state_batch_indices, int64_t pad_slot_id,
                                    Backend backend) {
  SpecRingParams p =
      ring_params(ring, state_batch_indices, "state_batch_indices", pad_slot_id, backend);
  p.window = window;
  p.buffer_len = buffer_len;
  p.ring_len = spec_ring_len(buffer_len, window);
  require_defined(accepted, "num_accepted_tokens");
  const DeviceCheck same_device_as_ring(ring, "ring", backend);
  same_device_as_ring(accepted, "num_accepted_tokens");
  require_rank(accepted, "num_accepted_tokens", 1, "(batch)");
  require_dtype(accepted, "num_accepted_tokens", DType::kInt32, "accepted tokens per row");
  if (state_batch_indices.defined()) {
    require_size(state_batch_indices, "state_batch_indices", 0, accepted.shape[0],
                 "batch (num_accepted_tokens.size(0))");
  } else if (accepted.shape[0] > p.slots) {
    fail("num_accepted_tokens.size(0)=", accepted.shape[0], " (batch) exceeds ring.size(0)=",
         p.slots, " (slots); pass state_batch_indices to map rows to slots");
  }
  require_no_aliasing({{&ring, "ring"}}, {{&accepted, "num_accepted_tokens"}});
  p.count = accepted.shape[0];
  p.num_accepted_tokens = accepted.ptr<const int32_t>();
  p.num_accepted_tokens_stride = accepted.strides[0];
  if (host_readable(accepted))
    check_accepted_values(p.num_accepted_tokens, p.num_accepted_tokens_stride, p.count, window,
                          p.slot_ids, p.slot_ids_stride, pad_slot_id);
  if (host_readable(ring))
    for (int64_t row = 0; row < p.count; ++row) {
      const int64_t slot = row_slot(p.slot_ids, p.slot_ids_stride, row, pad_slot_id);
      if (slot >= 0) check_ring_value(ring, slot, row, window, buffer_len, p.ring_len);
    }
  return p;
}

SpecRingParams validate_spec_reset(const TensorView& ring, const TensorView& slots,
                                   int64_t pad_slot_id, Backend backend) {
  require_defined(slots, "slots");
  return ring_params(ring, slots, "slots", pad_slot_id, backend);
}

}  // namespace replayssm
