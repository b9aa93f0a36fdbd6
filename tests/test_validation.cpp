// Argument validation: one case per error of src/api/validate.cpp. Each case breaks one thing in a
// valid call, then checks the exception type, that the message names the argument and the
// numbers, and that nothing at all was written.
#include <algorithm>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "replayssm/mamba2.hpp"
#include "replayssm/runtime.hpp"
#include "support/host_tensor.hpp"

namespace replayssm::test {
namespace {

using ::testing::HasSubstr;

constexpr int64_t H = 4, P = 3, N = 5, G = 2, kBatch = 3, kSlots = 5, L = 4;
constexpr Device kCudaDevice{DeviceType::kCuda, 0};

// A valid call of every entry point on small CPU tensors: activations bf16, state fp32,
// rows -> slots {3, pad, 0}; slot 3 sits at L - 1 (flushes), slot 0 at 0.
struct Call {
  std::deque<HostTensor> storage;  // everything the views point into (a deque keeps it in place)
  ReplayCache cache;
  Mamba2Step step;
  TensorView reset_slots;
  int64_t buffer_len = L;  // replay_advance's
  ExecOptions options;

  Call() {
    cache.state = tensor(DType::kFloat32, {kSlots, H, P, N});
    step.x = tensor(DType::kBFloat16, {kBatch, H, P});
    step.dt = tensor(DType::kBFloat16, {kBatch, H});
    step.A = tensor(DType::kFloat32, {H}, {}, -1.0);
    step.B = tensor(DType::kBFloat16, {kBatch, G, N});
    step.C = tensor(DType::kBFloat16, {kBatch, G, N});
    step.D = tensor(DType::kFloat32, {H});
    step.z = tensor(DType::kBFloat16, {kBatch, H, P});
    step.dt_bias = tensor(DType::kFloat32, {H});
    step.dt_softplus = true;
    step.state_batch_indices = ints({3, -1, 0});
    step.out = tensor(DType::kBFloat16, {kBatch, H, P});
    cache.x_cache = tensor(DType::kBFloat16, {kSlots, H, L, P});
    cache.B_cache = tensor(DType::kBFloat16, {kSlots, G, L, N});
    cache.dt_cache = tensor(DType::kFloat32, {kSlots, H, L});
    cache.cursors = ints({0, 1, 2, 3, 0});
    reset_slots = ints({2, -1});
  }

  // The checkpoint as int8 with its scales (valid).
  void int8_checkpoint() {
    cache.state = tensor(DType::kInt8, {kSlots, H, P, N}, {}, 3);
    cache.state_scale = tensor(DType::kFloat32, {kSlots, H, P}, {}, 0.01);
  }

  // A float16 checkpoint with stochastic rounding (valid).
  void stochastic_rounding() {
    cache.state = tensor(DType::kFloat16, {kSlots, H, P, N});
    cache.stochastic_rounding = true;
    cache.rounding_seed = ints({7, 11});
    cache.flush_counts = ints({0, 0, 0, 0, 0});
  }

  // A fresh tensor of `shape` (with `strides`, contiguous if empty), every element `value`.
  TensorView tensor(DType dtype, const std::vector<int64_t>& shape, std::vector<int64_t> strides = {},
                    double value = 0.5) {
    int64_t extent = element_count(shape);  // elements the view reaches
    if (!strides.empty()) {
      extent = 1;
      for (size_t d = 0; d < shape.size(); ++d) extent += (shape[d] - 1) * strides[d];
    }
    HostTensor& t = storage.emplace_back(dtype, std::vector<int64_t>{std::max<int64_t>(extent, 1)});
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, value);
    return make_view(t.data(), dtype, shape, {}, std::move(strides));
  }

  TensorView ints(const std::vector<int32_t>& values) {
    TensorView t = tensor(DType::kInt32, {int64_t(values.size())});
    for (size_t i = 0; i < values.size(); ++i) t.ptr<int32_t>()[i] = values[i];
    return t;
  }

  // The same shape with the last axis strided by 2 (every other element of a larger buffer).
  TensorView last_axis_strided(const TensorView& t) {
    std::vector<int64_t> shape(t.shape, t.shape + t.rank), strides(t.rank);
    int64_t stride = 2;
    for (int d = t.rank - 1; d >= 0; --d) {
      strides[d] = stride;
      stride *= shape[d];
    }
    return tensor(t.dtype, shape, strides);
  }

  TensorView reshaped(const TensorView& t, const std::vector<int64_t>& shape) {
    return tensor(t.dtype, shape);
  }
  TensorView retyped(const TensorView& t, DType dtype) {
    return tensor(dtype, std::vector<int64_t>(t.shape, t.shape + t.rank));
  }

  // A view of `dtype` and `shape` placed `offset_bytes` into the memory of `host`.
  static TensorView inside(const TensorView& host, int64_t offset_bytes, DType dtype,
                           const std::vector<int64_t>& shape) {
    return make_view(static_cast<char*>(host.data) + offset_bytes, dtype, shape);
  }

  std::vector<std::vector<uint8_t>> snapshot() const {
    std::vector<std::vector<uint8_t>> bytes;
    for (const HostTensor& t : storage) bytes.push_back(t.bytes());
    return bytes;
  }
};

// Which entry points a broken call is given to.
enum class Entry {
  kStep,    // selective_state_update and replay_decode: the step's arguments
  kBaseline,  // selective_state_update only
  kReplay,  // replay_decode: the cache's arguments
  kAdvance,
  kReset,
};

enum class Build { kAny, kWithCuda, kWithoutCuda };

struct ValidationCase {
  const char* name;
  Entry entry;
  std::function<void(Call&)> breaks;
  std::vector<std::string> message;  // substrings: the argument and the numbers
  Build build = Build::kAny;
};

void PrintTo(const ValidationCase& c, std::ostream* os) { *os << c.name; }

void invoke(const Call& call, Entry entry, bool replay) {
  switch (entry) {
    case Entry::kBaseline:
    case Entry::kStep:
      if (!replay) return selective_state_update(call.cache.state, call.step, call.options);
      [[fallthrough]];
    case Entry::kReplay:
      return replay_decode(call.cache, call.step, ReplayRoute::kAuto, call.options);
    case Entry::kAdvance:
      return replay_advance(call.cache.cursors, call.buffer_len, call.step.state_batch_indices,
                            call.step.pad_slot_id, call.options);
    case Entry::kReset:
      return replay_reset(call.cache.cursors, call.reset_slots, call.step.pad_slot_id, call.options);
  }
}

const char* entry_name(Entry entry, bool replay) {
  switch (entry) {
    case Entry::kStep: return replay ? "replay_decode" : "selective_state_update";
    case Entry::kBaseline: return "selective_state_update";
    case Entry::kReplay: return "replay_decode";
    case Entry::kAdvance: return "replay_advance";
    case Entry::kReset: return "replay_reset";
  }
  return "?";
}

// The cases, grouped as validate.cpp checks them.
std::vector<ValidationCase> cases() {
  std::vector<ValidationCase> c;
  auto add = [&](const char* name, Entry entry, std::function<void(Call&)> breaks,
                 std::vector<std::string> message, Build build = Build::kAny) {
    c.push_back({name, entry, std::move(breaks), std::move(message), build});
  };
  const Entry S = Entry::kStep, R = Entry::kReplay, A = Entry::kAdvance, Z = Entry::kReset;

  // Required tensors.
  add("MissingState", S, [](Call& k) { k.cache.state = {}; }, {"state is required but was not given"});
  add("MissingX", S, [](Call& k) { k.step.x = {}; }, {"x is required but was not given"});
  add("MissingDt", S, [](Call& k) { k.step.dt = {}; }, {"dt is required but was not given"});
  add("MissingA", S, [](Call& k) { k.step.A = {}; }, {"A is required but was not given"});
  add("MissingB", S, [](Call& k) { k.step.B = {}; }, {"B is required but was not given"});
  add("MissingC", S, [](Call& k) { k.step.C = {}; }, {"C is required but was not given"});
  add("MissingOut", S, [](Call& k) { k.step.out = {}; }, {"out is required but was not given"});
  add("MissingXCache", R, [](Call& k) { k.cache.x_cache = {}; }, {"x_cache is required but was not given"});
  add("MissingBCache", R, [](Call& k) { k.cache.B_cache = {}; }, {"B_cache is required but was not given"});
  add("MissingDtCache", R, [](Call& k) { k.cache.dt_cache = {}; }, {"dt_cache is required but was not given"});
  add("MissingCursors", R, [](Call& k) { k.cache.cursors = {}; }, {"cursors is required but was not given"});
  add("AdvanceMissingCursors", A, [](Call& k) { k.cache.cursors = {}; }, {"cursors is required but was not given"});
  add("ResetMissingCursors", Z, [](Call& k) { k.cache.cursors = {}; }, {"cursors is required but was not given"});
  add("ResetMissingSlots", Z, [](Call& k) { k.reset_slots = {}; }, {"slots is required but was not given"});

  // Backends and devices.
  add("CudaBackendWithCpuTensors", S, [](Call& k) { k.options.backend = Backend::kCuda; },
      {"the CUDA backend needs CUDA tensors, but state is on the CPU"}, Build::kWithCuda);
  add("CudaBackendInABuildWithoutCuda", S, [](Call& k) { k.options.backend = Backend::kCuda; },
      {"the CUDA backend is not available: this build of replayssm has no CUDA support"}, Build::kWithoutCuda);
  add("CpuBackendWithCudaState", S, [](Call& k) {
        k.cache.state.device = kCudaDevice;
        k.options.backend = Backend::kCpu;
      }, {"the cpu backend needs CPU tensors, but state is on cuda:0"});
  add("ReferenceBackendWithCudaState", S, [](Call& k) {
        k.cache.state.device = kCudaDevice;
        k.options.backend = Backend::kReference;
      }, {"the reference backend needs CPU tensors, but state is on cuda:0"});
  add("XOnAnotherDevice", S, [](Call& k) { k.step.x.device = kCudaDevice; }, {"x is on cuda:0 but state is on cpu:0"});
  add("DtBiasOnAnotherDevice", S, [](Call& k) { k.step.dt_bias.device = kCudaDevice; },
      {"dt_bias is on cuda:0 but state is on cpu:0"});
  add("IndicesOnAnotherDevice", S, [](Call& k) { k.step.state_batch_indices.device = kCudaDevice; },
      {"state_batch_indices is on cuda:0 but state is on cpu:0"});
  add("OutOnAnotherDevice", S, [](Call& k) { k.step.out.device = kCudaDevice; }, {"out is on cuda:0 but state is on cpu:0"});
  add("XCacheOnAnotherDevice", R, [](Call& k) { k.cache.x_cache.device = kCudaDevice; },
      {"x_cache is on cuda:0 but state is on cpu:0"});
  add("CursorsOnAnotherDevice", R, [](Call& k) { k.cache.cursors.device = kCudaDevice; },
      {"cursors is on cuda:0 but state is on cpu:0"});
  add("AdvanceCpuBackendWithCudaCursors", A, [](Call& k) {
        k.cache.cursors.device = kCudaDevice;
        k.options.backend = Backend::kCpu;
      }, {"the cpu backend needs CPU tensors, but cursors is on cuda:0"});
  add("AdvanceIndicesOnAnotherDevice", A, [](Call& k) { k.step.state_batch_indices.device = kCudaDevice; },
      {"state_batch_indices is on cuda:0 but cursors is on cpu:0"});
  add("ResetSlotsOnAnotherDevice", Z, [](Call& k) { k.reset_slots.device = kCudaDevice; },
      {"slots is on cuda:0 but cursors is on cpu:0"});

  // state.
  add("StateRank3", S, [](Call& k) { k.cache.state = k.reshaped(k.cache.state, {kSlots, H, P * N}); },
      {"state must have rank 4 (slots, nheads, head_dim, state_dim)", "got rank 3", "(5, 4, 15)"});
  add("StateNegativeSize", S, [](Call& k) { k.cache.state.shape[0] = -1; }, {"state.size(0)=-1 must not be negative"});
  add("StateNegativeStride", S, [](Call& k) { k.cache.state.strides[0] = -60; },
      {"state.stride(0)=-60 must not be negative"});
  add("StateEmptyHeadDim", S, [](Call& k) { k.cache.state = k.reshaped(k.cache.state, {kSlots, H, 0, N}); },
      {"state (5, 4, 0, 5) must have nheads, head_dim and state_dim >= 1"});
  add("StateFloat64OnCpuBackend", S, [](Call& k) { k.cache.state = k.retyped(k.cache.state, DType::kFloat64); },
      {"state has dtype float64, which only the reference backend accepts (backend is cpu)"});
  add("StateInt32", S, [](Call& k) { k.cache.state = k.retyped(k.cache.state, DType::kInt32); },
      {"state has dtype int32 but must be float32, float16 or bfloat16"});
  add("StateLastAxisStrided", S, [](Call& k) { k.cache.state = k.last_axis_strided(k.cache.state); },
      {"state.stride(3)=2 must be 1 (last axis contiguous)"});

  // 8-bit checkpoints and their scales.
  const Entry B = Entry::kBaseline;
  add("BaselineInt8State", B, [](Call& k) { k.int8_checkpoint(); },
      {"state has dtype int8, an 8-bit checkpoint format of replay_decode (with state_scale); "
       "selective_state_update needs float32, float16 or bfloat16"});
  add("Int8CheckpointWithoutScale", R, [](Call& k) {
        k.int8_checkpoint();
        k.cache.state_scale = {};
      }, {"state_scale (slots, nheads, head_dim) float32 is required: state has dtype int8"});
  add("Float8CheckpointWithoutScale", R, [](Call& k) { k.cache.state = k.retyped(k.cache.state, DType::kFloat8E4M3); },
      {"state_scale (slots, nheads, head_dim) float32 is required: state has dtype float8_e4m3fn"});
  add("ScaleWithFloat16State", R, [](Call& k) {
        k.int8_checkpoint();
        k.cache.state = k.retyped(k.cache.state, DType::kFloat16);
      }, {"state_scale was given but state has dtype float16; only int8 and float8_e4m3fn checkpoints have a scale"});
  add("ScaleRank2", R, [](Call& k) {
        k.int8_checkpoint();
        k.cache.state_scale = k.reshaped(k.cache.state_scale, {kSlots, H * P});
      }, {"state_scale must have rank 3 (slots, nheads, head_dim), got rank 2"});
  add("ScaleSlotsMismatch", R, [](Call& k) {
        k.int8_checkpoint();
        k.cache.state_scale = k.reshaped(k.cache.state_scale, {4, H, P});
      }, {"state_scale.size(0)=4 must equal slots (state.size(0))=5"});
  add("ScaleHeadsMismatch", R, [](Call& k) {
        k.int8_checkpoint();
        k.cache.state_scale = k.reshaped(k.cache.state_scale, {kSlots, 3, P});
      }, {"state_scale.size(1)=3 must equal nheads=4"});
  add("ScaleHeadDimMismatch", R, [](Call& k) {
        k.int8_checkpoint();
        k.cache.state_scale = k.reshaped(k.cache.state_scale, {kSlots, H, 2});
      }, {"state_scale.size(2)=2 must equal head_dim=3"});
  add("ScaleFloat16", R, [](Call& k) {
        k.int8_checkpoint();
        k.cache.state_scale = k.retyped(k.cache.state_scale, DType::kFloat16);
      }, {"state_scale has dtype float16 but must be float32"});
  add("ScaleLastAxisStrided", R, [](Call& k) {
        k.int8_checkpoint();
        k.cache.state_scale = k.last_axis_strided(k.cache.state_scale);
      }, {"state_scale.stride(2)=2 must be 1 (last axis contiguous)"});
  add("ScaleOnAnotherDevice", R, [](Call& k) {
        k.int8_checkpoint();
        k.cache.state_scale.device = kCudaDevice;
      }, {"state_scale is on cuda:0 but state is on cpu:0"});
  add("ScaleOverlapsXCache", R, [](Call& k) {
        k.int8_checkpoint();
        k.cache.state_scale = Call::inside(k.cache.x_cache, 0, DType::kFloat32, {kSlots, H, P});
      }, {"x_cache and state_scale overlap in memory"});

  // Stochastic rounding.
  add("StochasticRoundingFloat32State", R, [](Call& k) {
        k.stochastic_rounding();
        k.cache.state = k.retyped(k.cache.state, DType::kFloat32);
      }, {"stochastic_rounding needs a float16, bfloat16, int8 or float8_e4m3fn checkpoint, but state has dtype float32"});
  add("StochasticRoundingWithoutSeed", R, [](Call& k) {
        k.stochastic_rounding();
        k.cache.rounding_seed = {};
      }, {"rounding_seed (2) int32 is required when stochastic_rounding is on"});
  add("StochasticRoundingWithoutFlushCounts", R, [](Call& k) {
        k.stochastic_rounding();
        k.cache.flush_counts = {};
      }, {"flush_counts (slots) int32 is required when stochastic_rounding is on"});
  add("SeedRank2", R, [](Call& k) {
        k.stochastic_rounding();
        k.cache.rounding_seed = k.tensor(DType::kInt32, {1, 2});
      }, {"rounding_seed must have rank 1 (2), got rank 2"});
  add("SeedThreeWords", R, [](Call& k) {
        k.stochastic_rounding();
        k.cache.rounding_seed = k.ints({1, 2, 3});
      }, {"rounding_seed.size(0)=3 must equal the words of the Philox key=2"});
  add("SeedFloat32", R, [](Call& k) {
        k.stochastic_rounding();
        k.cache.rounding_seed = k.tensor(DType::kFloat32, {2});
      }, {"rounding_seed has dtype float32 but must be int32"});
  add("SeedOnAnotherDevice", R, [](Call& k) {
        k.stochastic_rounding();
        k.cache.rounding_seed.device = kCudaDevice;
      }, {"rounding_seed is on cuda:0 but state is on cpu:0"});
  add("FlushCountsRank2", R, [](Call& k) {
        k.stochastic_rounding();
        k.cache.flush_counts = k.tensor(DType::kInt32, {kSlots, 1});
      }, {"flush_counts must have rank 1 (slots), got rank 2"});
  add("FlushCountsSlotsMismatch", R, [](Call& k) {
        k.stochastic_rounding();
        k.cache.flush_counts = k.ints({0, 0, 0, 0});
      }, {"flush_counts.size(0)=4 must equal slots (state.size(0))=5"});
  add("FlushCountsFloat32", R, [](Call& k) {
        k.stochastic_rounding();
        k.cache.flush_counts = k.tensor(DType::kFloat32, {kSlots});
      }, {"flush_counts has dtype float32 but must be int32"});
  add("FlushCountsOverlapCursors", R, [](Call& k) {
        k.stochastic_rounding();
        k.cache.flush_counts = k.cache.cursors;
      }, {"flush_counts (written) overlaps cursors in memory"});
  add("FlushCountsOverlapSeed", R, [](Call& k) {
        k.stochastic_rounding();
        k.cache.rounding_seed = Call::inside(k.cache.flush_counts, 4, DType::kInt32, {2});
      }, {"flush_counts (written) overlaps rounding_seed in memory"});

  // x.
  add("XRank2", S, [](Call& k) { k.step.x = k.reshaped(k.step.x, {kBatch, H * P}); },
      {"x must have rank 3 (batch, nheads, head_dim)", "got rank 2", "(3, 12)"});
  add("XNegativeSize", S, [](Call& k) { k.step.x.shape[1] = -4; }, {"x.size(1)=-4 must not be negative"});
  add("XNegativeStride", S, [](Call& k) { k.step.x.strides[0] = -12; }, {"x.stride(0)=-12 must not be negative"});
  add("XHeadsMismatch", S, [](Call& k) { k.step.x = k.reshaped(k.step.x, {kBatch, 5, P}); },
      {"x.size(1)=5 must equal nheads (state.size(1))=4"});
  add("XHeadDimMismatch", S, [](Call& k) { k.step.x = k.reshaped(k.step.x, {kBatch, H, 2}); },
      {"x.size(2)=2 must equal head_dim (state.size(2))=3"});
  add("XInt32", S, [](Call& k) { k.step.x = k.retyped(k.step.x, DType::kInt32); },
      {"x has dtype int32 but must be float32, float16 or bfloat16"});
  add("XLastAxisStrided", S, [](Call& k) { k.step.x = k.last_axis_strided(k.step.x); },
      {"x.stride(2)=2 must be 1 (last axis contiguous)"});

  // B and C.
  add("BRank2", S, [](Call& k) { k.step.B = k.reshaped(k.step.B, {kBatch, G * N}); },
      {"B must have rank 3 (batch, ngroups, state_dim)", "got rank 2"});
  add("BBatchMismatch", S, [](Call& k) { k.step.B = k.reshaped(k.step.B, {2, G, N}); },
      {"B.size(0)=2 must equal batch (x.size(0))=3"});
  add("NgroupsNotDividingHeads", S, [](Call& k) {
        k.step.B = k.reshaped(k.step.B, {kBatch, 3, N});
        k.step.C = k.reshaped(k.step.C, {kBatch, 3, N});
      }, {"B.size(1)=3 (ngroups) must divide nheads=4"});
  add("NgroupsZero", S, [](Call& k) { k.step.B = k.reshaped(k.step.B, {kBatch, 0, N}); },
      {"B.size(1)=0 (ngroups) must divide nheads=4"});
  add("BStateDimMismatch", S, [](Call& k) { k.step.B = k.reshaped(k.step.B, {kBatch, G, 6}); },
      {"B.size(2)=6 must equal state_dim (state.size(3))=5"});
  add("BDtypeNotX", S, [](Call& k) { k.step.B = k.retyped(k.step.B, DType::kFloat32); },
      {"B has dtype float32 but must be bfloat16 (the dtype of x)"});
  add("BLastAxisStrided", S, [](Call& k) { k.step.B = k.last_axis_strided(k.step.B); },
      {"B.stride(2)=2 must be 1 (last axis contiguous)"});
  add("CRank2", S, [](Call& k) { k.step.C = k.reshaped(k.step.C, {kBatch, G * N}); },
      {"C must have rank 3 (batch, ngroups, state_dim)", "got rank 2"});
  add("CBatchMismatch", S, [](Call& k) { k.step.C = k.reshaped(k.step.C, {2, G, N}); },
      {"C.size(0)=2 must equal batch (x.size(0))=3"});
  add("CGroupsMismatch", S, [](Call& k) { k.step.C = k.reshaped(k.step.C, {kBatch, 1, N}); },
      {"C.size(1)=1 must equal ngroups (B.size(1))=2"});
  add("CStateDimMismatch", S, [](Call& k) { k.step.C = k.reshaped(k.step.C, {kBatch, G, 4}); },
      {"C.size(2)=4 must equal state_dim (state.size(3))=5"});
  add("CDtypeNotX", S, [](Call& k) { k.step.C = k.retyped(k.step.C, DType::kFloat16); },
      {"C has dtype float16 but must be bfloat16 (the dtype of x)"});
  add("CLastAxisStrided", S, [](Call& k) { k.step.C = k.last_axis_strided(k.step.C); },
      {"C.stride(2)=2 must be 1 (last axis contiguous)"});

  // dt.
  add("DtRank1", S, [](Call& k) { k.step.dt = k.reshaped(k.step.dt, {kBatch}); },
      {"dt must have rank 2 (batch, nheads) or 3 (batch, nheads, head_dim), got rank 1", "(3)"});
  add("DtRank4", S, [](Call& k) { k.step.dt = k.reshaped(k.step.dt, {kBatch, H, P, 1}); },
      {"dt must have rank 2 (batch, nheads) or 3 (batch, nheads, head_dim), got rank 4"});
  add("DtNegativeStride", S, [](Call& k) { k.step.dt.strides[0] = -4; }, {"dt.stride(0)=-4 must not be negative"});
  add("DtBatchMismatch", S, [](Call& k) { k.step.dt = k.reshaped(k.step.dt, {2, H}); },
      {"dt.size(0)=2 must equal batch (x.size(0))=3"});
  add("DtHeadsMismatch", S, [](Call& k) { k.step.dt = k.reshaped(k.step.dt, {kBatch, 5}); },
      {"dt.size(1)=5 must equal nheads=4"});
  add("DtHeadDimMismatch", S, [](Call& k) { k.step.dt = k.tensor(DType::kBFloat16, {kBatch, H, 2}, {H, 1, 0}); },
      {"dt.size(2)=2 must equal head_dim=3"});
  add("DtNotBroadcastOverHeadDim", S, [](Call& k) { k.step.dt = k.tensor(DType::kBFloat16, {kBatch, H, P}); },
      {"dt must be a per-head scalar: dt.stride(2)=1 must be 0 (broadcast over size 3)"});
  add("DtDtypeNeitherXNorFloat32", S, [](Call& k) { k.step.dt = k.retyped(k.step.dt, DType::kFloat16); },
      {"dt has dtype float16 but must be float32 or the dtype of x (bfloat16)"});

  // A, D, dt_bias: per-head scalars.
  add("ARank0", S, [](Call& k) { k.step.A.rank = 0; },
      {"A must have rank 1 (H) or 2 (H, P) or 3 (H, P, N), got rank 0"});
  add("ARank4", S, [](Call& k) { k.step.A = k.tensor(DType::kFloat32, {H, P, N, 1}, {1, 0, 0, 0}); },
      {"A must have rank 1 (H) or 2 (H, P) or 3 (H, P, N), got rank 4", "(4, 3, 5, 1)"});
  add("ANegativeStride", S, [](Call& k) { k.step.A.strides[0] = -1; }, {"A.stride(0)=-1 must not be negative"});
  add("AHeadsMismatch", S, [](Call& k) { k.step.A = k.reshaped(k.step.A, {5}); }, {"A.size(0)=5 must equal nheads=4"});
  add("AHeadDimMismatch", S, [](Call& k) { k.step.A = k.tensor(DType::kFloat32, {H, 2}, {1, 0}); },
      {"A.size(1)=2 must equal head_dim=3"});
  add("AStateDimMismatch", S, [](Call& k) { k.step.A = k.tensor(DType::kFloat32, {H, P, 6}, {1, 0, 0}); },
      {"A.size(2)=6 must equal state_dim=5"});
  add("AInt32", S, [](Call& k) { k.step.A = k.retyped(k.step.A, DType::kInt32); },
      {"A has dtype int32 but must be float32, float16 or bfloat16"});
  add("ANotBroadcastOverStateDim", S, [](Call& k) { k.step.A = k.tensor(DType::kFloat32, {H, P, N}, {N, 0, 1}); },
      {"A must be a per-head scalar: A.stride(2)=1 must be 0 (broadcast over size 5)"});
  add("DRank3", S, [](Call& k) { k.step.D = k.tensor(DType::kFloat32, {H, P, N}, {1, 0, 0}); },
      {"D must have rank 1 (H) or 2 (H, P), got rank 3"});
  add("DHeadsMismatch", S, [](Call& k) { k.step.D = k.reshaped(k.step.D, {3}); }, {"D.size(0)=3 must equal nheads=4"});
  add("DNotBroadcastOverHeadDim", S, [](Call& k) { k.step.D = k.tensor(DType::kFloat32, {H, P}); },
      {"D must be a per-head scalar: D.stride(1)=1 must be 0 (broadcast over size 3)"});
  add("DFloat64", S, [](Call& k) { k.step.D = k.retyped(k.step.D, DType::kFloat64); },
      {"D has dtype float64 but must be float32, float16 or bfloat16"});
  add("DtBiasRank3", S, [](Call& k) { k.step.dt_bias = k.tensor(DType::kFloat32, {H, P, N}, {1, 0, 0}); },
      {"dt_bias must have rank 1 (H) or 2 (H, P), got rank 3"});
  add("DtBiasHeadsMismatch", S, [](Call& k) { k.step.dt_bias = k.reshaped(k.step.dt_bias, {8}); },
      {"dt_bias.size(0)=8 must equal nheads=4"});
  add("DtBiasHeadDimMismatch", S, [](Call& k) { k.step.dt_bias = k.tensor(DType::kFloat32, {H, 7}, {1, 0}); },
      {"dt_bias.size(1)=7 must equal head_dim=3"});
  add("DtBiasNotBroadcastOverHeadDim", S, [](Call& k) { k.step.dt_bias = k.tensor(DType::kFloat32, {H, P}, {1, 4}); },
      {"dt_bias must be a per-head scalar: dt_bias.stride(1)=4 must be 0 (broadcast over size 3)"});
  add("DtBiasInt32", S, [](Call& k) { k.step.dt_bias = k.retyped(k.step.dt_bias, DType::kInt32); },
      {"dt_bias has dtype int32 but must be float32, float16 or bfloat16"});

  // z and out.
  add("ZRank2", S, [](Call& k) { k.step.z = k.reshaped(k.step.z, {kBatch, H * P}); },
      {"z must have rank 3 (batch, nheads, head_dim), got rank 2"});
  add("ZBatchMismatch", S, [](Call& k) { k.step.z = k.reshaped(k.step.z, {4, H, P}); },
      {"z.size(0)=4 must equal batch (x.size(0))=3"});
  add("ZHeadsMismatch", S, [](Call& k) { k.step.z = k.reshaped(k.step.z, {kBatch, 2, P}); },
      {"z.size(1)=2 must equal nheads=4"});
  add("ZHeadDimMismatch", S, [](Call& k) { k.step.z = k.reshaped(k.step.z, {kBatch, H, 4}); },
      {"z.size(2)=4 must equal head_dim=3"});
  add("ZDtypeNotX", S, [](Call& k) { k.step.z = k.retyped(k.step.z, DType::kFloat16); },
      {"z has dtype float16 but must be bfloat16 (the dtype of x)"});
  add("ZLastAxisStrided", S, [](Call& k) { k.step.z = k.last_axis_strided(k.step.z); },
      {"z.stride(2)=2 must be 1 (last axis contiguous)"});
  add("OutRank4", S, [](Call& k) { k.step.out = k.reshaped(k.step.out, {kBatch, H, P, 1}); },
      {"out must have rank 3 (batch, nheads, head_dim), got rank 4"});
  add("OutBatchMismatch", S, [](Call& k) { k.step.out = k.reshaped(k.step.out, {2, H, P}); },
      {"out.size(0)=2 must equal batch (x.size(0))=3"});
  add("OutHeadsMismatch", S, [](Call& k) { k.step.out = k.reshaped(k.step.out, {kBatch, 8, P}); },
      {"out.size(1)=8 must equal nheads=4"});
  add("OutHeadDimMismatch", S, [](Call& k) { k.step.out = k.reshaped(k.step.out, {kBatch, H, 1}); },
      {"out.size(2)=1 must equal head_dim=3"});
  add("OutDtypeNotX", S, [](Call& k) { k.step.out = k.retyped(k.step.out, DType::kFloat32); },
      {"out has dtype float32 but must be bfloat16 (the dtype of x)"});
  add("OutLastAxisStrided", S, [](Call& k) { k.step.out = k.last_axis_strided(k.step.out); },
      {"out.stride(2)=2 must be 1 (last axis contiguous)"});

  // state_batch_indices and slot values.
  add("IndicesRank2", S, [](Call& k) { k.step.state_batch_indices = k.tensor(DType::kInt32, {kBatch, 1}); },
      {"state_batch_indices must have rank 1 (batch), got rank 2"});
  add("IndicesBatchMismatch", S, [](Call& k) { k.step.state_batch_indices = k.ints({3, 0}); },
      {"state_batch_indices.size(0)=2 must equal batch (x.size(0))=3"});
  add("IndicesFloat32", S, [](Call& k) { k.step.state_batch_indices = k.tensor(DType::kFloat32, {kBatch}); },
      {"state_batch_indices has dtype float32 but must be int32 (slot indices)"});
  add("BatchExceedsSlotsWithoutIndices", S, [](Call& k) {
        k.step.state_batch_indices = {};
        k.cache.state = k.reshaped(k.cache.state, {2, H, P, N});
      }, {"x.size(0)=3 (batch) exceeds state.size(0)=2 (slots)"});
  add("SlotPastTheEnd", S, [](Call& k) { k.step.state_batch_indices = k.ints({3, 5, 0}); },
      {"state_batch_indices[1]=5 is out of range: must be in [0, 5) or equal pad_slot_id=-1"});
  add("SlotNegativeNotPad", S, [](Call& k) { k.step.state_batch_indices = k.ints({3, -1, -2}); },
      {"state_batch_indices[2]=-2 is out of range: must be in [0, 5) or equal pad_slot_id=-1"});
  add("SlotEqualToAnotherPadId", S, [](Call& k) { k.step.pad_slot_id = 7; },
      {"state_batch_indices[1]=-1 is out of range: must be in [0, 5) or equal pad_slot_id=7"});
  add("DuplicateSlots", S, [](Call& k) { k.step.state_batch_indices = k.ints({3, 3, 0}); },
      {"state_batch_indices maps two rows to slot 3"});

  // Aliasing: nothing written may share memory with anything else of the call.
  add("OutAliasesX", S, [](Call& k) { k.step.out = k.step.x; }, {"out (written) overlaps x in memory"});
  add("OutOverlapsXByOneElement", S, [](Call& k) {
        const TensorView both = k.tensor(DType::kBFloat16, {2 * kBatch * H * P});
        k.step.x = Call::inside(both, 0, DType::kBFloat16, {kBatch, H, P});
        k.step.out = Call::inside(both, (kBatch * H * P - 1) * 2, DType::kBFloat16, {kBatch, H, P});
      }, {"out (written) overlaps x in memory"});
  add("StateAliasesOut", S, [](Call& k) { k.step.out = Call::inside(k.cache.state, 64, DType::kBFloat16, {kBatch, H, P}); },
      {"state and out overlap in memory"});
  add("StateOverlapsB", S, [](Call& k) { k.step.B = Call::inside(k.cache.state, 400, DType::kBFloat16, {kBatch, G, N}); },
      {"state (written) overlaps B in memory"});
  add("OutOverlapsIndices", S, [](Call& k) {
        const TensorView both = k.tensor(DType::kInt32, {kBatch + kBatch * H * P});
        k.step.state_batch_indices = Call::inside(both, 0, DType::kInt32, {kBatch});
        k.step.state_batch_indices.ptr<int32_t>()[0] = 3;
        k.step.state_batch_indices.ptr<int32_t>()[1] = -1;
        k.step.state_batch_indices.ptr<int32_t>()[2] = 0;
        k.step.out = Call::inside(both, 8, DType::kBFloat16, {kBatch, H, P});
      }, {"out (written) overlaps state_batch_indices in memory"});
  add("XCacheOverlapsBCache", R, [](Call& k) {
        const TensorView both = k.tensor(DType::kBFloat16, {kSlots * H * L * P + kSlots * G * L * N});
        k.cache.x_cache = Call::inside(both, 0, DType::kBFloat16, {kSlots, H, L, P});
        k.cache.B_cache = Call::inside(both, 100, DType::kBFloat16, {kSlots, G, L, N});
      }, {"x_cache and B_cache overlap in memory"});
  add("StateOverlapsDtCache", R, [](Call& k) { k.cache.dt_cache = Call::inside(k.cache.state, 0, DType::kFloat32, {kSlots, H, L}); },
      {"state and dt_cache overlap in memory"});
  add("OutOverlapsXCache", R, [](Call& k) { k.step.out = Call::inside(k.cache.x_cache, 10, DType::kBFloat16, {kBatch, H, P}); },
      {"out and x_cache overlap in memory"});
  add("XCacheOverlapsX", R, [](Call& k) { k.step.x = Call::inside(k.cache.x_cache, 0, DType::kBFloat16, {kBatch, H, P}); },
      {"x_cache (written) overlaps x in memory"});
  add("DtCacheOverlapsCursors", R, [](Call& k) {
        const TensorView both = k.tensor(DType::kInt32, {kSlots * H * L + kSlots});
        TensorView cursors = Call::inside(both, 0, DType::kInt32, {kSlots});
        for (int i = 0; i < kSlots; ++i) cursors.ptr<int32_t>()[i] = 0;
        k.cache.cursors = cursors;
        k.cache.dt_cache = Call::inside(both, 4 * (kSlots - 1), DType::kFloat32, {kSlots, H, L});
      }, {"dt_cache (written) overlaps cursors in memory"});
  add("AdvanceCursorsOverlapIndices", A, [](Call& k) { k.step.state_batch_indices = Call::inside(k.cache.cursors, 4, DType::kInt32, {2}); },
      {"cursors (written) overlaps state_batch_indices in memory"});
  add("ResetCursorsOverlapSlots", Z, [](Call& k) { k.reset_slots = Call::inside(k.cache.cursors, 0, DType::kInt32, {1}); },
      {"cursors (written) overlaps slots in memory"});

  // The cache of replay_decode.
  add("XCacheRank3", R, [](Call& k) { k.cache.x_cache = k.reshaped(k.cache.x_cache, {kSlots, H, L * P}); },
      {"x_cache must have rank 4 (slots, nheads, L, head_dim), got rank 3"});
  add("BufferLengthZero", R, [](Call& k) { k.cache.x_cache = k.reshaped(k.cache.x_cache, {kSlots, H, 0, P}); },
      {"x_cache.size(2)=0 (L, the buffer length) must be in [1, 64]"});
  add("BufferLength65", R, [](Call& k) { k.cache.x_cache = k.reshaped(k.cache.x_cache, {kSlots, H, 65, P}); },
      {"x_cache.size(2)=65 (L, the buffer length) must be in [1, 64]"});
  add("XCacheSlotsMismatch", R, [](Call& k) { k.cache.x_cache = k.reshaped(k.cache.x_cache, {4, H, L, P}); },
      {"x_cache.size(0)=4 must equal slots (state.size(0))=5"});
  add("XCacheHeadsMismatch", R, [](Call& k) { k.cache.x_cache = k.reshaped(k.cache.x_cache, {kSlots, 3, L, P}); },
      {"x_cache.size(1)=3 must equal nheads=4"});
  add("XCacheHeadDimMismatch", R, [](Call& k) { k.cache.x_cache = k.reshaped(k.cache.x_cache, {kSlots, H, L, 2}); },
      {"x_cache.size(3)=2 must equal head_dim=3"});
  add("XCacheDtypeNotX", R, [](Call& k) { k.cache.x_cache = k.retyped(k.cache.x_cache, DType::kFloat32); },
      {"x_cache has dtype float32 but must be bfloat16 (the dtype of x)"});
  add("XCacheLastAxisStrided", R, [](Call& k) { k.cache.x_cache = k.last_axis_strided(k.cache.x_cache); },
      {"x_cache.stride(3)=2 must be 1 (last axis contiguous)"});
  add("BCacheRank3", R, [](Call& k) { k.cache.B_cache = k.reshaped(k.cache.B_cache, {kSlots, G, L * N}); },
      {"B_cache must have rank 4 (slots, ngroups, L, state_dim), got rank 3"});
  add("BCacheSlotsMismatch", R, [](Call& k) { k.cache.B_cache = k.reshaped(k.cache.B_cache, {6, G, L, N}); },
      {"B_cache.size(0)=6 must equal slots (state.size(0))=5"});
  add("BCacheGroupsMismatch", R, [](Call& k) { k.cache.B_cache = k.reshaped(k.cache.B_cache, {kSlots, 1, L, N}); },
      {"B_cache.size(1)=1 must equal ngroups (B.size(1))=2"});
  add("BCacheLengthMismatch", R, [](Call& k) { k.cache.B_cache = k.reshaped(k.cache.B_cache, {kSlots, G, 3, N}); },
      {"B_cache.size(2)=3 must equal L (x_cache.size(2))=4"});
  add("BCacheStateDimMismatch", R, [](Call& k) { k.cache.B_cache = k.reshaped(k.cache.B_cache, {kSlots, G, L, 6}); },
      {"B_cache.size(3)=6 must equal state_dim=5"});
  add("BCacheDtypeNotX", R, [](Call& k) { k.cache.B_cache = k.retyped(k.cache.B_cache, DType::kFloat16); },
      {"B_cache has dtype float16 but must be bfloat16 (the dtype of x)"});
  add("BCacheLastAxisStrided", R, [](Call& k) { k.cache.B_cache = k.last_axis_strided(k.cache.B_cache); },
      {"B_cache.stride(3)=2 must be 1 (last axis contiguous)"});
  add("DtCacheRank2", R, [](Call& k) { k.cache.dt_cache = k.reshaped(k.cache.dt_cache, {kSlots, H * L}); },
      {"dt_cache must have rank 3 (slots, nheads, L), got rank 2"});
  add("DtCacheSlotsMismatch", R, [](Call& k) { k.cache.dt_cache = k.reshaped(k.cache.dt_cache, {3, H, L}); },
      {"dt_cache.size(0)=3 must equal slots (state.size(0))=5"});
  add("DtCacheHeadsMismatch", R, [](Call& k) { k.cache.dt_cache = k.reshaped(k.cache.dt_cache, {kSlots, 3, L}); },
      {"dt_cache.size(1)=3 must equal nheads=4"});
  add("DtCacheLengthMismatch", R, [](Call& k) { k.cache.dt_cache = k.reshaped(k.cache.dt_cache, {kSlots, H, 5}); },
      {"dt_cache.size(2)=5 must equal L (x_cache.size(2))=4"});
  add("DtCacheNotFloat32", R, [](Call& k) { k.cache.dt_cache = k.retyped(k.cache.dt_cache, DType::kBFloat16); },
      {"dt_cache has dtype bfloat16 but must be float32 (raw dt widened to float32)"});
  add("DtCacheLastAxisStrided", R, [](Call& k) { k.cache.dt_cache = k.last_axis_strided(k.cache.dt_cache); },
      {"dt_cache.stride(2)=2 must be 1 (last axis contiguous)"});
  add("CursorsRank2", R, [](Call& k) { k.cache.cursors = k.tensor(DType::kInt32, {kSlots, 1}); },
      {"cursors must have rank 1 (slots), got rank 2"});
  add("CursorsSlotsMismatch", R, [](Call& k) { k.cache.cursors = k.ints({0, 0, 0, 0}); },
      {"cursors.size(0)=4 must equal slots (state.size(0))=5"});
  add("CursorsFloat32", R, [](Call& k) { k.cache.cursors = k.tensor(DType::kFloat32, {kSlots}); },
      {"cursors has dtype float32 but must be int32 (buffer fill per slot)"});
  add("CursorAtBufferLength", R, [](Call& k) { k.cache.cursors.ptr<int32_t>()[3] = L; },
      {"cursors[3]=4 (row 0) is out of range: must be in [0, L=4)"});
  add("CursorNegative", R, [](Call& k) { k.cache.cursors.ptr<int32_t>()[0] = -1; },
      {"cursors[0]=-1 (row 2) is out of range: must be in [0, L=4)"});

  // replay_advance and replay_reset.
  add("AdvanceBufferLengthZero", A, [](Call& k) { k.buffer_len = 0; }, {"buffer_len=0 (L) must be in [1, 64]"});
  add("AdvanceBufferLength65", A, [](Call& k) { k.buffer_len = 65; }, {"buffer_len=65 (L) must be in [1, 64]"});
  add("AdvanceCursorsRank2", A, [](Call& k) { k.cache.cursors = k.tensor(DType::kInt32, {kSlots, 1}); },
      {"cursors must have rank 1 (slots), got rank 2"});
  add("AdvanceCursorsFloat32", A, [](Call& k) { k.cache.cursors = k.tensor(DType::kFloat32, {kSlots}); },
      {"cursors has dtype float32 but must be int32 (buffer fill per slot)"});
  add("AdvanceIndicesRank2", A, [](Call& k) { k.step.state_batch_indices = k.tensor(DType::kInt32, {kBatch, 1}); },
      {"state_batch_indices must have rank 1 (n), got rank 2"});
  add("AdvanceIndicesFloat32", A, [](Call& k) { k.step.state_batch_indices = k.tensor(DType::kFloat32, {kBatch}); },
      {"state_batch_indices has dtype float32 but must be int32 (slot indices)"});
  add("AdvanceSlotPastTheEnd", A, [](Call& k) { k.step.state_batch_indices = k.ints({5, -1}); },
      {"state_batch_indices[0]=5 is out of range: must be in [0, 5) or equal pad_slot_id=-1"});
  add("AdvanceDuplicateSlots", A, [](Call& k) { k.step.state_batch_indices = k.ints({1, -1, 1}); },
      {"state_batch_indices maps two rows to slot 1"});
  add("ResetSlotsRank2", Z, [](Call& k) { k.reset_slots = k.tensor(DType::kInt32, {2, 1}); },
      {"slots must have rank 1 (n), got rank 2"});
  add("ResetSlotsFloat32", Z, [](Call& k) { k.reset_slots = k.tensor(DType::kFloat32, {2}); },
      {"slots has dtype float32 but must be int32 (slot indices)"});
  add("ResetCursorsFloat32", Z, [](Call& k) { k.cache.cursors = k.tensor(DType::kFloat32, {kSlots}); },
      {"cursors has dtype float32 but must be int32 (buffer fill per slot)"});
  add("ResetSlotPastTheEnd", Z, [](Call& k) { k.reset_slots = k.ints({2, 9}); },
      {"slots[1]=9 is out of range: must be in [0, 5) or equal pad_slot_id=-1"});
  add("ResetDuplicateSlots", Z, [](Call& k) { k.reset_slots = k.ints({2, -1, 2}); }, {"slots maps two rows to slot 2"});
  return c;
}

class ValidationTest : public ::testing::TestWithParam<ValidationCase> {};

TEST_P(ValidationTest, ThrowsNamingTheArgumentAndWritesNothing) {
  const ValidationCase& c = GetParam();
  if (c.build == Build::kWithCuda && !built_with_cuda()) GTEST_SKIP() << "this build has no CUDA support";
  if (c.build == Build::kWithoutCuda && built_with_cuda()) GTEST_SKIP() << "this build has CUDA support";
  for (bool replay : {false, true}) {
    if (c.entry != Entry::kStep && c.entry != Entry::kBaseline && !replay) continue;  // one entry point only
    if (c.entry == Entry::kBaseline && replay) continue;
    SCOPED_TRACE(entry_name(c.entry, replay));
    Call call;
    c.breaks(call);
    const auto before = call.snapshot();
    try {
      invoke(call, c.entry, replay);
      ADD_FAILURE() << "no exception";
    } catch (const InvalidArgument& e) {
      for (const std::string& part : c.message) EXPECT_THAT(e.what(), HasSubstr(part));
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not an InvalidArgument: " << e.what();
    }
    const auto after = call.snapshot();
    for (size_t i = 0; i < before.size(); ++i)
      EXPECT_TRUE(before[i] == after[i]) << "tensor #" << i << " of the call was written";
  }
}

INSTANTIATE_TEST_SUITE_P(Errors, ValidationTest, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// The unbroken call is valid for every entry point, so each error above comes from its one change.
TEST(ValidationControl, TheUnbrokenCallIsAccepted) {
  for (Entry entry : {Entry::kStep, Entry::kReplay, Entry::kAdvance, Entry::kReset}) {
    Call call;
    EXPECT_NO_THROW(invoke(call, entry, false)) << entry_name(entry, false);
  }
}

// The valid low-precision calls: each error above comes from its one change.
TEST(ValidationControl, LowPrecisionCheckpointsAreAccepted) {
  for (Backend backend : {Backend::kReference, Backend::kCpu}) {
    SCOPED_TRACE(backend_name(backend));
    Call int8, stochastic, float8;
    int8.int8_checkpoint();
    stochastic.stochastic_rounding();
    float8.int8_checkpoint();
    float8.cache.state = float8.retyped(float8.cache.state, DType::kFloat8E4M3);
    float8.stochastic_rounding();
    float8.cache.state = float8.retyped(float8.cache.state, DType::kFloat8E4M3);
    for (Call* call : {&int8, &stochastic, &float8}) {
      call->options.backend = backend;
      EXPECT_NO_THROW(invoke(*call, Entry::kReplay, true));
    }
    // The flush row (slot 3) counted its flush, and only it.
    EXPECT_EQ(stochastic.cache.flush_counts.ptr<int32_t>()[3], 1);
    EXPECT_EQ(stochastic.cache.flush_counts.ptr<int32_t>()[0], 0);
  }
}

TEST(ValidationControl, TheReferenceBackendAcceptsAFloat64State) {
  Call call;
  call.cache.state = call.retyped(call.cache.state, DType::kFloat64);
  call.options.backend = Backend::kReference;
  EXPECT_NO_THROW(invoke(call, Entry::kStep, false));
  EXPECT_NO_THROW(invoke(call, Entry::kStep, true));
}

// x, B and C as interleaved column slices of one xBC projection share a buffer but no element:
// accepted, and computed exactly as from separate tensors.
TEST(ValidationControl, InterleavedXbcSlicesAreAccepted) {
  for (bool replay : {false, true}) {
    SCOPED_TRACE(replay ? "replay_decode" : "selective_state_update");
    Call packed, separate;
    const int64_t width = H * P + 2 * G * N;
    const TensorView xbc = packed.tensor(DType::kBFloat16, {kBatch, width});
    for (int64_t i = 0; i < kBatch * width; ++i)
      xbc.ptr<uint16_t>()[i] = float_to_bf16(0.01f * float(i % 97) - 0.4f);
    packed.step.x = make_view(xbc.data, DType::kBFloat16, {kBatch, H, P}, {}, {width, P, 1});
    packed.step.B = make_view(xbc.ptr<uint16_t>() + H * P, DType::kBFloat16, {kBatch, G, N}, {}, {width, N, 1});
    packed.step.C = make_view(xbc.ptr<uint16_t>() + H * P + G * N, DType::kBFloat16, {kBatch, G, N}, {}, {width, N, 1});
    for (TensorView* t : {&separate.step.x, &separate.step.B, &separate.step.C}) {
      const TensorView& from = t == &separate.step.x ? packed.step.x : t == &separate.step.B ? packed.step.B : packed.step.C;
      const int64_t inner = from.shape[1] * from.shape[2];
      for (int64_t b = 0; b < kBatch; ++b)
        for (int64_t i = 0; i < inner; ++i)
          t->ptr<uint16_t>()[b * inner + i] = static_cast<const uint16_t*>(from.data)[b * width + i];
    }
    ASSERT_NO_THROW(invoke(packed, Entry::kStep, replay));
    invoke(separate, Entry::kStep, replay);
    auto bytes_of = [](const TensorView& t) {
      const auto* p = static_cast<const uint8_t*>(t.data);
      return std::vector<uint8_t>(p, p + t.numel() * dtype_size(t.dtype));
    };
    EXPECT_EQ(bytes_of(packed.step.out), bytes_of(separate.step.out));
    EXPECT_EQ(bytes_of(packed.cache.state), bytes_of(separate.cache.state));
    EXPECT_EQ(bytes_of(packed.cache.x_cache), bytes_of(separate.cache.x_cache));
    EXPECT_EQ(bytes_of(packed.cache.B_cache), bytes_of(separate.cache.B_cache));
  }
}

}  // namespace
}  // namespace replayssm::test
