#include "api/validate.hpp"

#include <cstdint>
#include <utility>
#include <vector>

#include "api/checks.hpp"
#include "replayssm/runtime.hpp"

namespace replayssm {
namespace {

void check_cursor_values(const TensorView& cursors, int64_t buffer_len, const Mamba2Params& p) {
  const int32_t* c = cursors.ptr<int32_t>();
  for (int64_t row = 0; row < p.batch; ++row) {
    const int64_t slot = slot_of_row(p, row);
    if (slot < 0) continue;
    const int32_t v = c[slot * cursors.strides[0]];
    if (v < 0 || v >= buffer_len)
      fail("cursors[", slot, "]=", v, " (row ", row, ") is out of range: must be in [0, L=",
           buffer_len, ")");
  }
}

}  // namespace

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::kAuto: return "auto";
    case Backend::kReference: return "reference";
    case Backend::kCpu: return "cpu";
    case Backend::kCuda: return "cuda";
  }
  return "unknown";
}

const char* route_name(ReplayRoute route) {
  switch (route) {
    case ReplayRoute::kAuto: return "auto";
    case ReplayRoute::kOutputOnly: return "output-only";
    case ReplayRoute::kStateAndOutput: return "state-and-output";
  }
  return "unknown";
}

Backend resolve_backend(Backend requested, Device device) {
  Backend b = requested;
  if (b == Backend::kAuto) b = device.type == DeviceType::kCuda ? Backend::kCuda : Backend::kCpu;
  if (b == Backend::kCuda && !built_with_cuda())
    fail("the CUDA backend is not available: this build of replayssm has no CUDA support");
  return b;
}

namespace {

std::vector<std::pair<const TensorView*, const char*>> step_inputs(const Mamba2Step& s) {
  return {{&s.x, "x"}, {&s.dt, "dt"}, {&s.A, "A"}, {&s.B, "B"}, {&s.C, "C"}, {&s.D, "D"},
          {&s.z, "z"}, {&s.dt_bias, "dt_bias"}, {&s.state_batch_indices, "state_batch_indices"}};
}

}  // namespace

namespace {

// The state and the step, shared by both entry points; `checkpoint`: the state is replay_decode's
// checkpoint, which may also be 8-bit.
Mamba2Params validate_step(const TensorView& state, const Mamba2Step& s, Backend backend,
                           bool checkpoint) {
  require_defined(state, "state");
  for (auto [t, name] : {std::pair{&s.x, "x"}, {&s.dt, "dt"}, {&s.A, "A"}, {&s.B, "B"},
                         {&s.C, "C"}, {&s.out, "out"}})
    require_defined(*t, name);

  const DeviceCheck same_device_as_state(state, "state", backend);
  for (auto [t, name] : {std::pair{&s.x, "x"}, {&s.dt, "dt"}, {&s.A, "A"}, {&s.B, "B"},
                         {&s.C, "C"}, {&s.D, "D"}, {&s.z, "z"}, {&s.dt_bias, "dt_bias"},
                         {&s.state_batch_indices, "state_batch_indices"}, {&s.out, "out"}})
    same_device_as_state(*t, name);

  require_rank(state, "state", 4, "(slots, nheads, head_dim, state_dim)");
  Mamba2Params p;
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
  } else if (is_scaled_checkpoint(state.dtype)) {
    if (!checkpoint)
      fail("state has dtype ", dtype_name(state.dtype), ", an 8-bit checkpoint format of "
           "replay_decode (with state_scale); selective_state_update needs float32, float16 or "
           "bfloat16");
  } else {
    require_float16_32(state, "state");
  }
  require_last_contiguous(state, "state");

  require_rank(s.x, "x", 3, "(batch, nheads, head_dim)");
  p.batch = s.x.shape[0];
  require_size(s.x, "x", 1, p.nheads, "nheads (state.size(1))");
  require_size(s.x, "x", 2, p.head_dim, "head_dim (state.size(2))");
  require_float16_32(s.x, "x");
  require_last_contiguous(s.x, "x");
  p.act_dtype = s.x.dtype;

  require_rank(s.B, "B", 3, "(batch, ngroups, state_dim)");
  require_size(s.B, "B", 0, p.batch, "batch (x.size(0))");
  p.ngroups = s.B.shape[1];
  if (p.ngroups < 1 || p.nheads % p.ngroups != 0)
    fail("B.size(1)=", p.ngroups, " (ngroups) must divide nheads=", p.nheads);
  p.heads_per_group = p.nheads / p.ngroups;
  require_size(s.B, "B", 2, p.state_dim, "state_dim (state.size(3))");
  require_dtype(s.B, "B", p.act_dtype, "the dtype of x");
  require_last_contiguous(s.B, "B");

  require_rank(s.C, "C", 3, "(batch, ngroups, state_dim)");
  require_size(s.C, "C", 0, p.batch, "batch (x.size(0))");
  require_size(s.C, "C", 1, p.ngroups, "ngroups (B.size(1))");
  require_size(s.C, "C", 2, p.state_dim, "state_dim (state.size(3))");
  require_dtype(s.C, "C", p.act_dtype, "the dtype of x");
  require_last_contiguous(s.C, "C");

  if (s.dt.rank != 2 && s.dt.rank != 3)
    fail("dt must have rank 2 (batch, nheads) or 3 (batch, nheads, head_dim), got rank ", s.dt.rank,
         " with shape ", shape_string(s.dt));
  require_rank(s.dt, "dt", s.dt.rank, "");
  require_size(s.dt, "dt", 0, p.batch, "batch (x.size(0))");
  require_size(s.dt, "dt", 1, p.nheads, "nheads");
  if (s.dt.rank == 3) {
    require_size(s.dt, "dt", 2, p.head_dim, "head_dim");
    require_broadcast(s.dt, "dt", 2);
  }
  if (s.dt.dtype != p.act_dtype && s.dt.dtype != DType::kFloat32)
    fail("dt has dtype ", dtype_name(s.dt.dtype), " but must be float32 or the dtype of x (",
         dtype_name(p.act_dtype), ")");
  p.dt_dtype = s.dt.dtype;

  p.A = head_scalar(s.A, "A", p.nheads, p.head_dim, p.state_dim, 3);
  p.D = head_scalar(s.D, "D", p.nheads, p.head_dim, p.state_dim, 2);
  p.dt_bias = head_scalar(s.dt_bias, "dt_bias", p.nheads, p.head_dim, p.state_dim, 2);
  p.dt_softplus = s.dt_softplus;

  if (s.z.defined()) {
    require_rank(s.z, "z", 3, "(batch, nheads, head_dim)");
    require_size(s.z, "z", 0, p.batch, "batch (x.size(0))");
    require_size(s.z, "z", 1, p.nheads, "nheads");
    require_size(s.z, "z", 2, p.head_dim, "head_dim");
    require_dtype(s.z, "z", p.act_dtype, "the dtype of x");
    require_last_contiguous(s.z, "z");
  }
  require_rank(s.out, "out", 3, "(batch, nheads, head_dim)");
  require_size(s.out, "out", 0, p.batch, "batch (x.size(0))");
  require_size(s.out, "out", 1, p.nheads, "nheads");
  require_size(s.out, "out", 2, p.head_dim, "head_dim");
  require_dtype(s.out, "out", p.act_dtype, "the dtype of x");
  require_last_contiguous(s.out, "out");

  const TensorView& sbi = s.state_batch_indices;
  if (sbi.defined()) {
    require_rank(sbi, "state_batch_indices", 1, "(batch)");
    require_size(sbi, "state_batch_indices", 0, p.batch, "batch (x.size(0))");
    require_dtype(sbi, "state_batch_indices", DType::kInt32, "slot indices");
    p.state_batch_indices = sbi.ptr<const int32_t>();
    p.state_batch_indices_stride = sbi.strides[0];
  } else if (p.batch > p.slots) {
    fail("x.size(0)=", p.batch, " (batch) exceeds state.size(0)=", p.slots,
         " (slots); pass state_batch_indices to map rows to slots");
  }
  p.pad_slot_id = s.pad_slot_id;
  require_no_aliasing({{&state, "state"}, {&s.out, "out"}}, step_inputs(s));
  if (host_readable(sbi))
    check_slot_values(p.state_batch_indices, p.state_batch_indices_stride, p.batch, p.slots,
                      p.pad_slot_id, "state_batch_indices", true);

  p.x = s.x.data;
  p.x_stride_batch = s.x.strides[0];
  p.x_stride_head = s.x.strides[1];
  p.dt = s.dt.data;
  p.dt_stride_batch = s.dt.strides[0];
  p.dt_stride_head = s.dt.strides[1];
  p.B = s.B.data;
  p.B_stride_batch = s.B.strides[0];
  p.B_stride_group = s.B.strides[1];
  p.C = s.C.data;
  p.C_stride_batch = s.C.strides[0];
  p.C_stride_group = s.C.strides[1];
  p.z = s.z.data;
  p.z_stride_batch = s.z.defined() ? s.z.strides[0] : 0;
  p.z_stride_head = s.z.defined() ? s.z.strides[1] : 0;
  p.out = s.out.data;
  p.out_stride_batch = s.out.strides[0];
  p.out_stride_head = s.out.strides[1];
  p.device_index = state.device.index;
  p.state = state.data;
  p.state_dtype = state.dtype;
  p.state_stride_slot = state.strides[0];
  p.state_stride_head = state.strides[1];
  p.state_stride_p = state.strides[2];
  return p;
}

// state_scale, present iff the checkpoint is 8-bit.
void validate_state_scale(const ReplayCache& c, ReplayParams& p) {
  const TensorView& scale = c.state_scale;
  if (!is_scaled_checkpoint(p.state_dtype)) {
    if (scale.defined())
      fail("state_scale was given but state has dtype ", dtype_name(p.state_dtype),
           "; only int8 and float8_e4m3fn checkpoints have a scale");
    return;
  }
  if (!scale.defined())
    fail("state_scale (slots, nheads, head_dim) float32 is required: state has dtype ",
         dtype_name(p.state_dtype), ", stored as value / scale");
  require_rank(scale, "state_scale", 3, "(slots, nheads, head_dim)");
  require_size(scale, "state_scale", 0, p.slots, "slots (state.size(0))");
  require_size(scale, "state_scale", 1, p.nheads, "nheads");
  require_size(scale, "state_scale", 2, p.head_dim, "head_dim");
  require_dtype(scale, "state_scale", DType::kFloat32, "one scale per row of the checkpoint");
  require_last_contiguous(scale, "state_scale");
  p.state_scale = scale.ptr<float>();
  p.scale_stride_slot = scale.strides[0];
  p.scale_stride_head = scale.strides[1];
}

// rounding_seed and flush_counts: checked whenever given, required with stochastic_rounding.
void validate_stochastic_rounding(const ReplayCache& c, ReplayParams& p) {
  if (c.rounding_seed.defined()) {
    require_rank(c.rounding_seed, "rounding_seed", 1, "(2)");
    require_size(c.rounding_seed, "rounding_seed", 0, 2, "the words of the Philox key");
    require_dtype(c.rounding_seed, "rounding_seed", DType::kInt32, "the Philox key");
  }
  if (c.flush_counts.defined()) {
    require_rank(c.flush_counts, "flush_counts", 1, "(slots)");
    require_size(c.flush_counts, "flush_counts", 0, p.slots, "slots (state.size(0))");
    require_dtype(c.flush_counts, "flush_counts", DType::kInt32, "flushes per slot");
  }
  if (!c.stochastic_rounding) return;
  if (p.state_dtype == DType::kFloat32 || p.state_dtype == DType::kFloat64)
    fail("stochastic_rounding needs a float16, bfloat16, int8 or float8_e4m3fn checkpoint, but "
         "state has dtype ", dtype_name(p.state_dtype));
  if (!c.rounding_seed.defined())
    fail("rounding_seed (2) int32 is required when stochastic_rounding is on");
  if (!c.flush_counts.defined())
    fail("flush_counts (slots) int32 is required when stochastic_rounding is on");
  p.stochastic_rounding = true;
  p.rounding_seed = c.rounding_seed.ptr<const int32_t>();
  p.rounding_seed_stride = c.rounding_seed.strides[0];
  p.flush_counts = c.flush_counts.ptr<int32_t>();
  p.flush_counts_stride = c.flush_counts.strides[0];
}

}  // namespace

Mamba2Params validate_state_update(const TensorView& state, const Mamba2Step& s, Backend backend) {
  return validate_step(state, s, backend, false);
}

ReplayParams validate_replay_decode(const ReplayCache& c, const Mamba2Step& s, ReplayRoute route,
                                    Backend backend, const TensorView& workspace) {
  ReplayParams p;
  static_cast<Mamba2Params&>(p) = validate_step(c.state, s, backend, true);
  const DeviceCheck same_device_as_state(c.state, "state", backend);
  for (auto [t, name] : {std::pair{&c.x_cache, "x_cache"}, {&c.B_cache, "B_cache"},
                         {&c.dt_cache, "dt_cache"}, {&c.cursors, "cursors"}}) {
    require_defined(*t, name);
    same_device_as_state(*t, name);
  }
  for (auto [t, name] : {std::pair{&c.state_scale, "state_scale"}, {&c.rounding_seed, "rounding_seed"},
                         {&c.flush_counts, "flush_counts"}})
    same_device_as_state(*t, name);

  require_rank(c.x_cache, "x_cache", 4, "(slots, nheads, L, head_dim)");
  p.buffer_len = c.x_cache.shape[2];
  if (p.buffer_len < 1 || p.buffer_len > kMaxBufferLen)
    fail("x_cache.size(2)=", p.buffer_len, " (L, the buffer length) must be in [1, ", kMaxBufferLen,
         "]");
  require_input_caches(c.x_cache, c.B_cache, c.dt_cache,
                       {p.slots, p.nheads, p.head_dim, p.ngroups, p.state_dim, p.buffer_len, p.act_dtype,
                        "L", "L (x_cache.size(2))", "ngroups (B.size(1))"});

  require_rank(c.cursors, "cursors", 1, "(slots)");
  require_size(c.cursors, "cursors", 0, p.slots, "slots (state.size(0))");
  require_dtype(c.cursors, "cursors", DType::kInt32, "buffer fill per slot");

  validate_state_scale(c, p);
  validate_stochastic_rounding(c, p);
  p.workspace = checked_workspace(
      workspace, same_device_as_state, backend, replay_decode_workspace_bytes(p.batch, p.nheads, p.head_dim),
      "batch=" + std::to_string(p.batch) + ", nheads=" + std::to_string(p.nheads) +
          ", head_dim=" + std::to_string(p.head_dim),
      "replay_decode_workspace_bytes");

  const TensorView no_tensor;
  require_no_aliasing({{&c.state, "state"}, {&s.out, "out"}, {&c.x_cache, "x_cache"},
                       {&c.B_cache, "B_cache"}, {&c.dt_cache, "dt_cache"},
                       {&c.state_scale, "state_scale"},
                       {c.stochastic_rounding ? &c.flush_counts : &no_tensor, "flush_counts"},
                       {p.workspace ? &workspace : &no_tensor, "workspace"}},
                      [&] {
                        auto r = step_inputs(s);
                        r.push_back({&c.cursors, "cursors"});
                        if (c.stochastic_rounding) r.push_back({&c.rounding_seed, "rounding_seed"});
                        return r;
                      }());
  if (host_readable(c.cursors)) check_cursor_values(c.cursors, p.buffer_len, p);

  p.route = route;
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
  p.cursors = c.cursors.ptr<const int32_t>();
  p.cursors_stride = c.cursors.strides[0];
  return p;
}

namespace {

CursorParams cursor_params(const TensorView& cursors, const TensorView& ids, const char* ids_name,
                           int64_t pad_slot_id, Backend backend) {
  require_defined(cursors, "cursors");
  const DeviceCheck same_device_as_cursors(cursors, "cursors", backend);
  same_device_as_cursors(ids, ids_name);
  require_rank(cursors, "cursors", 1, "(slots)");
  require_dtype(cursors, "cursors", DType::kInt32, "buffer fill per slot");
  CursorParams p;
  p.device_index = cursors.device.index;
  p.cursors = cursors.ptr<int32_t>();
  p.cursors_stride = cursors.strides[0];
  p.slots = cursors.shape[0];
  p.pad_slot_id = pad_slot_id;
  const SlotIdList list = slot_id_list(ids, ids_name, cursors, "cursors", p.slots, pad_slot_id);
  p.slot_ids = list.ids;
  p.slot_ids_stride = list.stride;
  p.count = list.count;
  return p;
}

}  // namespace

CursorParams validate_advance(const TensorView& cursors, int64_t buffer_len,
                              const TensorView& state_batch_indices, int64_t pad_slot_id,
                              Backend backend) {
  CursorParams p =
      cursor_params(cursors, state_batch_indices, "state_batch_indices", pad_slot_id, backend);
  if (buffer_len < 1 || buffer_len > kMaxBufferLen)
    fail("buffer_len=", buffer_len, " (L) must be in [1, ", kMaxBufferLen, "]");
  p.buffer_len = buffer_len;
  return p;
}

CursorParams validate_reset(const TensorView& cursors, const TensorView& slots, int64_t pad_slot_id,
                            Backend backend) {
  require_defined(slots, "slots");
  return cursor_params(cursors, slots, "slots", pad_slot_id, backend);
}

}  // namespace replayssm
