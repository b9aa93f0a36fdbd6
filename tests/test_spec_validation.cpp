// Argument validation of the speculative entry points: one case per error of
// src/api/validate_spec.cpp. Each case breaks one thing in a valid call, then checks the exception
// type, that the message names the argument and the numbers, and that nothing at all was written.
#include <algorithm>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "replayssm/mamba2_spec.hpp"
#include "support/host_tensor.hpp"

namespace replayssm::test {
namespace {

using ::testing::HasSubstr;

constexpr int64_t H = 4, P = 3, N = 5, G = 2, T = 2, kBatch = 3, kSlots = 5, L = 4, R = 4;
constexpr Device kCudaDevice{DeviceType::kCuda, 0};

// A valid call of every speculative entry point on small CPU tensors: activations bf16, state
// fp32, rows -> slots {3, pad, 0}; slot 3 has committed 2 inputs (it flushes), slot 0 none. The
// baseline's rows own slots {3, 4} and {0, 1} and accepted 2 and 1 tokens last time.
struct Call {
  std::deque<HostTensor> storage;
  SpecCache cache;
  Mamba2Window window;
  TensorView verify_slots;    // (batch): spec_verify's and spec_commit's state_batch_indices
  TensorView baseline_slots;  // (batch, T): spec_state_update's
  TensorView accepted;        // (batch)
  TensorView reset_slots;
  int64_t window_len = T, buffer_len = L;
  ExecOptions options;

  Call() {
    cache.state = tensor(DType::kFloat32, {kSlots, H, P, N});
    window.x = tensor(DType::kBFloat16, {kBatch, T, H, P});
    window.dt = tensor(DType::kBFloat16, {kBatch, T, H});
    window.A = tensor(DType::kFloat32, {H}, {}, -1.0);
    window.B = tensor(DType::kBFloat16, {kBatch, T, G, N});
    window.C = tensor(DType::kBFloat16, {kBatch, T, G, N});
    window.D = tensor(DType::kFloat32, {H});
    window.z = tensor(DType::kBFloat16, {kBatch, T, H, P});
    window.dt_bias = tensor(DType::kFloat32, {H});
    window.dt_softplus = true;
    window.num_valid_tokens = ints({2, 1, 1});
    window.out = tensor(DType::kBFloat16, {kBatch, T, H, P});
    cache.x_cache = tensor(DType::kBFloat16, {kSlots, H, R, P});
    cache.B_cache = tensor(DType::kBFloat16, {kSlots, G, R, N});
    cache.dt_cache = tensor(DType::kFloat32, {kSlots, H, R});
    cache.ring = ints({0, 0, 0, 0, 0, 0, 1, 2, 0, 0}, {kSlots, 2});
    verify_slots = ints({3, -1, 0});
    baseline_slots = ints({3, 4, -1, -1, 0, 1}, {kBatch, T});
    accepted = ints({2, 1, 1});
    reset_slots = ints({2, -1});
  }

  TensorView tensor(DType dtype, const std::vector<int64_t>& shape, std::vector<int64_t> strides = {},
                    double value = 0.5) {
    int64_t extent = element_count(shape);
    if (!strides.empty()) {
      extent = 1;
      for (size_t d = 0; d < shape.size(); ++d) extent += (shape[d] - 1) * strides[d];
    }
    HostTensor& t = storage.emplace_back(dtype, std::vector<int64_t>{std::max<int64_t>(extent, 1)});
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, value);
    return make_view(t.data(), dtype, shape, {}, std::move(strides));
  }

  TensorView ints(const std::vector<int32_t>& values, std::vector<int64_t> shape = {}) {
    if (shape.empty()) shape = {int64_t(values.size())};
    TensorView t = tensor(DType::kInt32, shape);
    for (size_t i = 0; i < values.size(); ++i) t.ptr<int32_t>()[i] = values[i];
    return t;
  }

  TensorView reshaped(const TensorView& t, const std::vector<int64_t>& shape) { return tensor(t.dtype, shape); }
  TensorView retyped(const TensorView& t, DType dtype) {
    return tensor(dtype, std::vector<int64_t>(t.shape, t.shape + t.rank));
  }
  TensorView last_axis_strided(const TensorView& t) {
    std::vector<int64_t> shape(t.shape, t.shape + t.rank), strides(t.rank);
    int64_t stride = 2;
    for (int d = t.rank - 1; d >= 0; --d) {
      strides[d] = stride;
      stride *= shape[d];
    }
    return tensor(t.dtype, shape, strides);
  }
  void set(TensorView& t, int64_t i, int32_t v) { t.ptr<int32_t>()[i] = v; }

  std::vector<std::vector<uint8_t>> snapshot() const {
    std::vector<std::vector<uint8_t>> bytes;
    for (const HostTensor& t : storage) bytes.push_back(t.bytes());
    return bytes;
  }
};

enum class Entry {
  kWindow,    // spec_verify and spec_state_update: the window's arguments
  kVerify,    // spec_verify only
  kBaseline,  // spec_state_update only
  kCommit,
  kReset,
};

struct ValidationCase {
  const char* name;
  Entry entry;
  std::function<void(Call&)> breaks;
  std::vector<std::string> message;
};

void PrintTo(const ValidationCase& c, std::ostream* os) { *os << c.name; }

void invoke(const Call& call, Entry entry, bool baseline) {
  Mamba2Window w = call.window;
  w.state_batch_indices = call.verify_slots;
  switch (entry) {
    case Entry::kWindow:
      if (!baseline) return spec_verify(call.cache, w, call.buffer_len, call.options);
      [[fallthrough]];
    case Entry::kBaseline:
      w.state_batch_indices = call.baseline_slots;
      return spec_state_update(call.cache.state, w, call.accepted, call.options);
    case Entry::kVerify: return spec_verify(call.cache, w, call.buffer_len, call.options);
    case Entry::kCommit:
      return spec_commit(call.cache.ring, call.accepted, call.window_len, call.buffer_len,
                         call.verify_slots, w.pad_slot_id, call.options);
    case Entry::kReset: return spec_reset(call.cache.ring, call.reset_slots, w.pad_slot_id, call.options);
  }
}

std::vector<ValidationCase> cases() {
  std::vector<ValidationCase> c;
  auto add = [&](const char* name, Entry entry, std::function<void(Call&)> breaks, std::vector<std::string> message) {
    c.push_back({name, entry, std::move(breaks), std::move(message)});
  };
  const Entry W = Entry::kWindow, V = Entry::kVerify, B = Entry::kBaseline, C = Entry::kCommit, Z = Entry::kReset;

  // Required tensors.
  add("MissingState", W, [](Call& k) { k.cache.state = {}; }, {"state is required but was not given"});
  add("MissingX", W, [](Call& k) { k.window.x = {}; }, {"x is required but was not given"});
  add("MissingDt", W, [](Call& k) { k.window.dt = {}; }, {"dt is required but was not given"});
  add("MissingA", W, [](Call& k) { k.window.A = {}; }, {"A is required but was not given"});
  add("MissingB", W, [](Call& k) { k.window.B = {}; }, {"B is required but was not given"});
  add("MissingC", W, [](Call& k) { k.window.C = {}; }, {"C is required but was not given"});
  add("MissingOut", W, [](Call& k) { k.window.out = {}; }, {"out is required but was not given"});
  add("BaselineMissingIndices", B, [](Call& k) { k.baseline_slots = {}; },
      {"state_batch_indices is required but was not given"});
  add("BaselineMissingAccepted", B, [](Call& k) { k.accepted = {}; }, {"num_accepted_tokens is required but was not given"});
  add("MissingXCache", V, [](Call& k) { k.cache.x_cache = {}; }, {"x_cache is required but was not given"});
  add("MissingBCache", V, [](Call& k) { k.cache.B_cache = {}; }, {"B_cache is required but was not given"});
  add("MissingDtCache", V, [](Call& k) { k.cache.dt_cache = {}; }, {"dt_cache is required but was not given"});
  add("MissingRing", V, [](Call& k) { k.cache.ring = {}; }, {"ring is required but was not given"});
  add("CommitMissingRing", C, [](Call& k) { k.cache.ring = {}; }, {"ring is required but was not given"});
  add("CommitMissingAccepted", C, [](Call& k) { k.accepted = {}; }, {"num_accepted_tokens is required but was not given"});
  add("ResetMissingSlots", Z, [](Call& k) { k.reset_slots = {}; }, {"slots is required but was not given"});

  // Devices.
  add("CpuBackendWithCudaState", W, [](Call& k) {
        k.cache.state.device = kCudaDevice;
        k.options.backend = Backend::kCpu;
      }, {"the cpu backend needs CPU tensors, but state is on cuda:0"});
  add("XOnAnotherDevice", W, [](Call& k) { k.window.x.device = kCudaDevice; }, {"x is on cuda:0 but state is on cpu:0"});
  add("ValidTokensOnAnotherDevice", W, [](Call& k) { k.window.num_valid_tokens.device = kCudaDevice; },
      {"num_valid_tokens is on cuda:0 but state is on cpu:0"});
  add("OutOnAnotherDevice", W, [](Call& k) { k.window.out.device = kCudaDevice; }, {"out is on cuda:0 but state is on cpu:0"});
  add("RingOnAnotherDevice", V, [](Call& k) { k.cache.ring.device = kCudaDevice; }, {"ring is on cuda:0 but state is on cpu:0"});
  add("AcceptedOnAnotherDevice", B, [](Call& k) { k.accepted.device = kCudaDevice; },
      {"num_accepted_tokens is on cuda:0 but state is on cpu:0"});
  add("CommitAcceptedOnAnotherDevice", C, [](Call& k) { k.accepted.device = kCudaDevice; },
      {"num_accepted_tokens is on cuda:0 but ring is on cpu:0"});
  add("CommitIndicesOnAnotherDevice", C, [](Call& k) { k.verify_slots.device = kCudaDevice; },
      {"state_batch_indices is on cuda:0 but ring is on cpu:0"});
  add("ResetCpuBackendWithCudaRing", Z, [](Call& k) {
        k.cache.ring.device = kCudaDevice;
        k.options.backend = Backend::kCpu;
      }, {"the cpu backend needs CPU tensors, but ring is on cuda:0"});

  // state.
  add("StateRank3", W, [](Call& k) { k.cache.state = k.reshaped(k.cache.state, {kSlots, H, P * N}); },
      {"state must have rank 4 (slots, nheads, head_dim, state_dim)", "got rank 3"});
  add("StateEmptyHeadDim", W, [](Call& k) { k.cache.state = k.reshaped(k.cache.state, {kSlots, H, 0, N}); },
      {"state (5, 4, 0, 5) must have nheads, head_dim and state_dim >= 1"});
  add("StateFloat64OnCpuBackend", W, [](Call& k) { k.cache.state = k.retyped(k.cache.state, DType::kFloat64); },
      {"state has dtype float64, which only the reference backend accepts (backend is cpu)"});
  add("StateInt32", W, [](Call& k) { k.cache.state = k.retyped(k.cache.state, DType::kInt32); },
      {"state has dtype int32 but must be float32, float16 or bfloat16"});
  add("StateLastAxisStrided", W, [](Call& k) { k.cache.state = k.last_axis_strided(k.cache.state); },
      {"state.stride(3)=2 must be 1 (last axis contiguous)"});

  // x and the window length.
  add("XRank3", W, [](Call& k) { k.window.x = k.reshaped(k.window.x, {kBatch, H, P}); },
      {"x must have rank 4 (batch, T, nheads, head_dim)", "got rank 3"});
  add("WindowEmpty", W, [](Call& k) { k.window.x = k.reshaped(k.window.x, {kBatch, 0, H, P}); },
      {"x.size(1)=0 (T, tokens per verify window) must be in [1, 8]"});
  add("WindowTooLong", W, [](Call& k) { k.window.x = k.reshaped(k.window.x, {kBatch, 9, H, P}); },
      {"x.size(1)=9 (T, tokens per verify window) must be in [1, 8]"});
  add("XHeadsMismatch", W, [](Call& k) { k.window.x = k.reshaped(k.window.x, {kBatch, T, 5, P}); },
      {"x.size(2)=5 must equal nheads (state.size(1))=4"});
  add("XHeadDimMismatch", W, [](Call& k) { k.window.x = k.reshaped(k.window.x, {kBatch, T, H, 2}); },
      {"x.size(3)=2 must equal head_dim (state.size(2))=3"});
  add("XInt32", W, [](Call& k) { k.window.x = k.retyped(k.window.x, DType::kInt32); },
      {"x has dtype int32 but must be float32, float16 or bfloat16"});
  add("XLastAxisStrided", W, [](Call& k) { k.window.x = k.last_axis_strided(k.window.x); },
      {"x.stride(3)=2 must be 1 (last axis contiguous)"});

  // B, C, z, out: (batch, T, heads or groups, channels).
  add("BRank3", W, [](Call& k) { k.window.B = k.reshaped(k.window.B, {kBatch, G, N}); },
      {"B must have rank 4 (batch, T, ngroups, state_dim)", "got rank 3"});
  add("NgroupsNotDividingHeads", W, [](Call& k) { k.window.B = k.reshaped(k.window.B, {kBatch, T, 3, N}); },
      {"B.size(2)=3 (ngroups) must divide nheads=4"});
  add("BBatchMismatch", W, [](Call& k) { k.window.B = k.reshaped(k.window.B, {2, T, G, N}); },
      {"B.size(0)=2 must equal batch (x.size(0))=3"});
  add("BWindowMismatch", W, [](Call& k) { k.window.B = k.reshaped(k.window.B, {kBatch, 1, G, N}); },
      {"B.size(1)=1 must equal T (x.size(1))=2"});
  add("BStateDimMismatch", W, [](Call& k) { k.window.B = k.reshaped(k.window.B, {kBatch, T, G, 6}); },
      {"B.size(3)=6 must equal state_dim (state.size(3))=5"});
  add("BDtypeNotX", W, [](Call& k) { k.window.B = k.retyped(k.window.B, DType::kFloat32); },
      {"B has dtype float32 but must be bfloat16 (the dtype of x)"});
  add("BLastAxisStrided", W, [](Call& k) { k.window.B = k.last_axis_strided(k.window.B); },
      {"B.stride(3)=2 must be 1 (last axis contiguous)"});
  add("CGroupsMismatch", W, [](Call& k) { k.window.C = k.reshaped(k.window.C, {kBatch, T, 1, N}); },
      {"C.size(2)=1 must equal ngroups (B.size(2))=2"});
  add("ZWindowMismatch", W, [](Call& k) { k.window.z = k.reshaped(k.window.z, {kBatch, 3, H, P}); },
      {"z.size(1)=3 must equal T (x.size(1))=2"});
  add("OutHeadsMismatch", W, [](Call& k) { k.window.out = k.reshaped(k.window.out, {kBatch, T, 2, P}); },
      {"out.size(2)=2 must equal nheads=4"});

  // dt and the per-head scalars.
  add("DtRank2", W, [](Call& k) { k.window.dt = k.reshaped(k.window.dt, {kBatch, T}); },
      {"dt must have rank 3 (batch, T, nheads) or 4 (batch, T, nheads, head_dim), got rank 2"});
  add("DtWindowMismatch", W, [](Call& k) { k.window.dt = k.reshaped(k.window.dt, {kBatch, 1, H}); },
      {"dt.size(1)=1 must equal T (x.size(1))=2"});
  add("DtPerChannelNotBroadcast", W, [](Call& k) { k.window.dt = k.reshaped(k.window.dt, {kBatch, T, H, P}); },
      {"dt must be a per-head scalar: dt.stride(3)=1 must be 0 (broadcast over size 3)"});
  add("DtFloat16UnderBf16", W, [](Call& k) { k.window.dt = k.retyped(k.window.dt, DType::kFloat16); },
      {"dt has dtype float16 but must be float32 or the dtype of x (bfloat16)"});
  add("AHeadsMismatch", W, [](Call& k) { k.window.A = k.reshaped(k.window.A, {3}); }, {"A.size(0)=3 must equal nheads=4"});

  // num_valid_tokens.
  add("ValidTokensRank2", W, [](Call& k) { k.window.num_valid_tokens = k.reshaped(k.window.num_valid_tokens, {kBatch, 1}); },
      {"num_valid_tokens must have rank 1 (batch)", "got rank 2"});
  add("ValidTokensBatchMismatch", W, [](Call& k) { k.window.num_valid_tokens = k.ints({1, 1}); },
      {"num_valid_tokens.size(0)=2 must equal batch (x.size(0))=3"});
  add("ValidTokensFloat", W, [](Call& k) { k.window.num_valid_tokens = k.retyped(k.window.num_valid_tokens, DType::kFloat32); },
      {"num_valid_tokens has dtype float32 but must be int32 (tokens per row)"});
  add("ValidTokensZero", W, [](Call& k) { k.set(k.window.num_valid_tokens, 2, 0); },
      {"num_valid_tokens[2]=0 is out of range: must be in [1, T=2]"});
  add("ValidTokensBeyondWindow", W, [](Call& k) { k.set(k.window.num_valid_tokens, 0, 3); },
      {"num_valid_tokens[0]=3 is out of range: must be in [1, T=2]"});

  // state_batch_indices.
  add("VerifyIndicesRank2", V, [](Call& k) { k.verify_slots = k.baseline_slots; },
      {"state_batch_indices must have rank 1 (batch)", "got rank 2"});
  add("VerifyIndicesBatchMismatch", V, [](Call& k) { k.verify_slots = k.ints({3, 0}); },
      {"state_batch_indices.size(0)=2 must equal batch (x.size(0))=3"});
  add("VerifyIndicesFloat", V, [](Call& k) { k.verify_slots = k.retyped(k.verify_slots, DType::kFloat32); },
      {"state_batch_indices has dtype float32 but must be int32 (slot indices)"});
  add("VerifyBatchExceedsSlots", V, [](Call& k) {
        k.verify_slots = {};
        k.cache.state = k.reshaped(k.cache.state, {2, H, P, N});
      }, {"x.size(0)=3 (batch) exceeds state.size(0)=2 (slots); pass state_batch_indices to map rows to slots"});
  add("VerifyIndexOutOfRange", V, [](Call& k) { k.set(k.verify_slots, 2, 5); },
      {"state_batch_indices[2]=5 is out of range: must be in [0, 5) or equal pad_slot_id=-1"});
  add("VerifyDuplicateSlot", V, [](Call& k) { k.set(k.verify_slots, 2, 3); },
      {"state_batch_indices maps two rows to slot 3: rows of one call must use distinct slots"});
  add("BaselineIndicesRank1", B, [](Call& k) { k.baseline_slots = k.ints({3, -1, 0}); },
      {"state_batch_indices must have rank 2 (batch, T)", "got rank 1"});
  add("BaselineIndicesWindowMismatch", B, [](Call& k) { k.baseline_slots = k.ints({3, -1, 0}, {kBatch, 1}); },
      {"state_batch_indices.size(1)=1 must equal T (x.size(1))=2"});
  add("BaselineIndexOutOfRange", B, [](Call& k) { k.set(k.baseline_slots, 4, 7); },
      {"state_batch_indices[2, 0]=7 is out of range: must be in [0, 5)"});
  add("BaselineSourceOutOfRange", B, [](Call& k) {
        k.set(k.window.num_valid_tokens, 0, 1);
        k.set(k.baseline_slots, 1, -1);
      }, {"state_batch_indices[0, 1]=-1 is out of range: must be in [0, 5) (the accepted position of the previous window)"});
  add("BaselineDuplicateSlot", B, [](Call& k) { k.set(k.baseline_slots, 4, 4); },
      {"state_batch_indices maps two positions to slot 4: the slots of one call must be distinct"});

  // num_accepted_tokens.
  add("BaselineAcceptedBatchMismatch", B, [](Call& k) { k.accepted = k.ints({1, 1}); },
      {"num_accepted_tokens.size(0)=2 must equal batch (x.size(0))=3"});
  add("BaselineAcceptedFloat", B, [](Call& k) { k.accepted = k.retyped(k.accepted, DType::kFloat32); },
      {"num_accepted_tokens has dtype float32 but must be int32 (accepted tokens per row)"});
  add("BaselineAcceptedZero", B, [](Call& k) { k.set(k.accepted, 0, 0); },
      {"num_accepted_tokens[0]=0 is out of range: must be in [1, T=2]"});
  add("CommitAcceptedRank2", C, [](Call& k) { k.accepted = k.reshaped(k.accepted, {kBatch, 1}); },
      {"num_accepted_tokens must have rank 1 (batch)", "got rank 2"});
  add("CommitAcceptedFloat", C, [](Call& k) { k.accepted = k.retyped(k.accepted, DType::kFloat32); },
      {"num_accepted_tokens has dtype float32 but must be int32 (accepted tokens per row)"});
  add("CommitAcceptedBeyondWindow", C, [](Call& k) { k.set(k.accepted, 2, 3); },
      {"num_accepted_tokens[2]=3 is out of range: must be in [1, T=2]"});
  add("CommitIndicesBatchMismatch", C, [](Call& k) { k.verify_slots = k.ints({3, 0}); },
      {"state_batch_indices.size(0)=2 must equal batch (num_accepted_tokens.size(0))=3"});
  add("CommitBatchExceedsSlots", C, [](Call& k) {
        k.verify_slots = {};
        k.accepted = k.ints({1, 1, 1, 1, 1, 1});
      }, {"num_accepted_tokens.size(0)=6 (batch) exceeds ring.size(0)=5 (slots)"});
  add("CommitIndexOutOfRange", C, [](Call& k) { k.set(k.verify_slots, 0, 9); },
      {"state_batch_indices[0]=9 is out of range: must be in [0, 5) or equal pad_slot_id=-1"});
  add("CommitWindowZero", C, [](Call& k) { k.window_len = 0; }, {"window=0 (T, tokens per verify window) must be in [1, 8]"});
  add("CommitBufferTooShort", C, [](Call& k) { k.buffer_len = 3; },
      {"buffer_len=3 (L) must be in [2 x window=4, 64]: the ring holds the committed history plus one window"});
  add("CommitRingAliasesAccepted", C, [](Call& k) { k.accepted = make_view(k.cache.ring.data, DType::kInt32, {kBatch}); },
      {"ring (written) overlaps num_accepted_tokens in memory"});

  // The buffer and the ring.
  add("VerifyBufferTooShort", V, [](Call& k) { k.buffer_len = 3; }, {"buffer_len=3 (L) must be in [2 x window=4, 64]"});
  add("VerifyBufferTooLong", V, [](Call& k) { k.buffer_len = 65; }, {"buffer_len=65 (L) must be in [2 x window=4, 64]"});
  add("XCacheRank3", V, [](Call& k) { k.cache.x_cache = k.reshaped(k.cache.x_cache, {kSlots, H, R * P}); },
      {"x_cache must have rank 4 (slots, nheads, R, head_dim)", "got rank 3"});
  add("XCacheSlotsMismatch", V, [](Call& k) { k.cache.x_cache = k.reshaped(k.cache.x_cache, {4, H, R, P}); },
      {"x_cache.size(0)=4 must equal slots (state.size(0))=5"});
  add("XCacheRingMismatch", V, [](Call& k) { k.cache.x_cache = k.reshaped(k.cache.x_cache, {kSlots, H, 5, P}); },
      {"x_cache.size(2)=5 must equal R (spec_ring_len(L, T))=4"});
  add("XCacheDtypeNotX", V, [](Call& k) { k.cache.x_cache = k.retyped(k.cache.x_cache, DType::kFloat16); },
      {"x_cache has dtype float16 but must be bfloat16 (the dtype of x)"});
  add("BCacheRingMismatch", V, [](Call& k) { k.cache.B_cache = k.reshaped(k.cache.B_cache, {kSlots, G, 8, N}); },
      {"B_cache.size(2)=8 must equal R (spec_ring_len(L, T))=4"});
  add("BCacheGroupsMismatch", V, [](Call& k) { k.cache.B_cache = k.reshaped(k.cache.B_cache, {kSlots, 1, R, N}); },
      {"B_cache.size(1)=1 must equal ngroups (B.size(2))=2"});
  add("DtCacheRingMismatch", V, [](Call& k) { k.cache.dt_cache = k.reshaped(k.cache.dt_cache, {kSlots, H, 2}); },
      {"dt_cache.size(2)=2 must equal R (spec_ring_len(L, T))=4"});
  add("DtCacheBf16", V, [](Call& k) { k.cache.dt_cache = k.retyped(k.cache.dt_cache, DType::kBFloat16); },
      {"dt_cache has dtype bfloat16 but must be float32 (raw dt widened to float32)"});
  add("RingRank1", V, [](Call& k) { k.cache.ring = k.ints({0, 0, 0, 0, 0}); },
      {"ring must have rank 2 (slots, 2): origin, committed", "got rank 1"});
  add("RingSlotsMismatch", V, [](Call& k) { k.cache.ring = k.ints({0, 0, 0, 0}, {2, 2}); },
      {"ring.size(0)=2 must equal slots (state.size(0))=5"});
  add("RingThreeFields", V, [](Call& k) { k.cache.ring = k.reshaped(k.cache.ring, {kSlots, 3}); },
      {"ring.size(1)=3 must equal 2 (origin, committed)=2"});
  add("RingFloat", V, [](Call& k) { k.cache.ring = k.retyped(k.cache.ring, DType::kFloat32); },
      {"ring has dtype float32 but must be int32 (ring origin and committed count per slot)"});
  add("RingOriginOutOfRange", V, [](Call& k) { k.set(k.cache.ring, 6, 4); },
      {"ring[3]=(4, 2) (row 0) is out of range: origin must be in [0, R=4) and committed in [0, L - T=2]"});
  add("RingCommittedOutOfRange", V, [](Call& k) { k.set(k.cache.ring, 1, 3); },
      {"ring[0]=(0, 3) (row 2) is out of range: origin must be in [0, R=4) and committed in [0, L - T=2]"});
  add("CommitRingCommittedOutOfRange", C, [](Call& k) { k.set(k.cache.ring, 7, -1); },
      {"ring[3]=(1, -1) (row 0) is out of range"});
  add("OutAliasesXCache", V, [](Call& k) {
        k.window.out = make_view(k.cache.x_cache.data, DType::kBFloat16, {kBatch, T, H, P});
      }, {"out and x_cache overlap in memory"});
  add("BaselineOutAliasesState", B, [](Call& k) {
        k.window.out = make_view(k.cache.state.data, DType::kBFloat16, {kBatch, T, H, P});
      }, {"state and out overlap in memory"});
  add("ResetRingRank1", Z, [](Call& k) { k.cache.ring = k.ints({0, 0, 0, 0, 0}); },
      {"ring must have rank 2 (slots, 2): origin, committed"});
  add("ResetSlotOutOfRange", Z, [](Call& k) { k.set(k.reset_slots, 0, 5); },
      {"slots[0]=5 is out of range: must be in [0, 5) or equal pad_slot_id=-1"});
  return c;
}

class SpecValidationTest : public ::testing::TestWithParam<ValidationCase> {};

TEST_P(SpecValidationTest, ThrowsNamingTheArgumentAndWritesNothing) {
  const ValidationCase& c = GetParam();
  const std::vector<bool> baseline_modes =
      c.entry == Entry::kWindow ? std::vector<bool>{false, true} : std::vector<bool>{c.entry == Entry::kBaseline};
  for (bool baseline : baseline_modes) {
    Call call;
    c.breaks(call);
    const auto before = call.snapshot();
    try {
      invoke(call, c.entry, baseline);
      ADD_FAILURE() << c.name << (baseline ? " (baseline)" : "") << ": no exception";
    } catch (const InvalidArgument& e) {
      for (const std::string& part : c.message)
        EXPECT_THAT(e.what(), HasSubstr(part)) << (baseline ? "baseline" : "");
    }
    EXPECT_TRUE(call.snapshot() == before) << c.name << ": something was written";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, SpecValidationTest, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// The valid call of every entry point runs (the cases above break exactly one thing each).
TEST(SpecValidation, TheUnbrokenCallsRun) {
  for (Entry entry : {Entry::kVerify, Entry::kBaseline, Entry::kCommit, Entry::kReset}) {
    Call call;
    EXPECT_NO_THROW(invoke(call, entry, entry == Entry::kBaseline));
  }
}

}  // namespace
}  // namespace replayssm::test
