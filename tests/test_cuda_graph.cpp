// CUDA only (skipped without a device): ReplaySSM decode captured in a CUDA graph and replayed
// across several flushes, and padded batches. The oracle is the fp64 reference backend.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "replayssm/mamba2.hpp"
#include "replayssm/runtime.hpp"

namespace replayssm {
namespace {

void check_cuda(cudaError_t status, const char* call) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(status));
}
#define TEST_CUDA(call) check_cuda((call), #call)

constexpr Device kGpu{DeviceType::kCuda, 0};
constexpr uint32_t kCanaryBits = 0xffc0dead;  // a NaN no kernel computes
constexpr double kFp32Tolerance = 1e-5;       // relative to max |oracle out|

// fp32 device memory mirrored by a host vector.
class DeviceArray {
 public:
  explicit DeviceArray(size_t count) : host(count) {
    TEST_CUDA(cudaMalloc(&device_, count * 4 + 4));
  }
  ~DeviceArray() { cudaFree(device_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  void upload(cudaStream_t stream) {
    TEST_CUDA(cudaMemcpyAsync(device_, host.data(), host.size() * 4, cudaMemcpyHostToDevice, stream));
  }
  void download(cudaStream_t stream) {
    TEST_CUDA(cudaMemcpyAsync(host.data(), device_, host.size() * 4, cudaMemcpyDeviceToHost, stream));
    TEST_CUDA(cudaStreamSynchronize(stream));
  }
  TensorView view(DType dtype, std::initializer_list<int64_t> dims) const {
    return TensorView::contiguous(device_, dtype, dims, kGpu);
  }
  int32_t* ints() { return reinterpret_cast<int32_t*>(host.data()); }
  float* floats() { return host.data(); }

  std::vector<float> host;

 private:
  void* device_ = nullptr;
};

struct Shape {
  int64_t H, P, N, G;
};

// How gtest shows a case's parameters (ctest's listing, failure messages).
void PrintTo(const Shape& s, std::ostream* os) {
  *os << "H" << s.H << "P" << s.P << "N" << s.N << "G" << s.G;
}

// One layer's tensors on the device, the same values on the host for the oracle, and the oracle's
// fp64 state of every slot.
class Layer {
 public:
  Layer(Shape s, int64_t batch, int64_t slots, int64_t L, uint64_t seed)
      : s_(s), batch_(batch), slots_(slots), L_(L), rng_(seed),
        x(batch * s.H * s.P), dt(batch * s.H), B(batch * s.G * s.N), C(batch * s.G * s.N),
        z(batch * s.H * s.P), A(s.H), D(s.H), dt_bias(s.H), indices(batch),
        out(batch * s.H * s.P), state(slots * s.H * s.P * s.N), x_cache(slots * s.H * L * s.P),
        B_cache(slots * s.G * L * s.N), dt_cache(slots * s.H * L), cursors(slots),
        oracle_state(state.host.size()) {
    for (int64_t h = 0; h < s.H; ++h) {
      A.host[h] = -uniform(0.5, 8.0);
      D.host[h] = uniform(-1.0, 1.0);
      dt_bias.host[h] = uniform(-4.0, -2.0);
    }
    for (size_t i = 0; i < state.host.size(); ++i) {
      state.host[i] = uniform(-1.0, 1.0);
      oracle_state[i] = state.host[i];
    }
    for (DeviceArray* a : {&x_cache, &B_cache, &dt_cache}) fill_canary(*a);
    for (DeviceArray* a : {&A, &D, &dt_bias, &state, &x_cache, &B_cache, &dt_cache, &cursors})
      a->upload(nullptr);
    TEST_CUDA(cudaDeviceSynchronize());
  }

  static void fill_canary(DeviceArray& a) {
    for (float& v : a.host) std::memcpy(&v, &kCanaryBits, 4);
  }

  // Fresh inputs for every row and the slot of each row (pad_slot_id for pad rows).
  void new_inputs(const std::vector<int32_t>& row_slots) {
    for (DeviceArray* a : {&x, &B, &C, &z})
      for (float& v : a->host) v = uniform(-1.0, 1.0);
    for (float& v : dt.host) v = uniform(-1.0, 1.0);
    for (int64_t r = 0; r < batch_; ++r) indices.ints()[r] = row_slots[r];
    fill_canary(out);
  }
  void upload_inputs(cudaStream_t stream) {
    for (DeviceArray* a : {&x, &dt, &B, &C, &z, &indices, &out}) a->upload(stream);
  }

  Mamba2Step step() const {
    Mamba2Step st;
    st.x = x.view(DType::kFloat32, {batch_, s_.H, s_.P});
    st.dt = dt.view(DType::kFloat32, {batch_, s_.H});
    st.A = A.view(DType::kFloat32, {s_.H});
    st.B = B.view(DType::kFloat32, {batch_, s_.G, s_.N});
    st.C = C.view(DType::kFloat32, {batch_, s_.G, s_.N});
    st.D = D.view(DType::kFloat32, {s_.H});
    st.z = z.view(DType::kFloat32, {batch_, s_.H, s_.P});
    st.dt_bias = dt_bias.view(DType::kFloat32, {s_.H});
    st.dt_softplus = true;
    st.state_batch_indices = indices.view(DType::kInt32, {batch_});
    st.pad_slot_id = kPad;
    st.out = out.view(DType::kFloat32, {batch_, s_.H, s_.P});
    return st;
  }
  ReplayCache cache() const {
    return ReplayCache{state.view(DType::kFloat32, {slots_, s_.H, s_.P, s_.N}),
                       x_cache.view(DType::kFloat32, {slots_, s_.H, L_, s_.P}),
                       B_cache.view(DType::kFloat32, {slots_, s_.G, L_, s_.N}),
                       dt_cache.view(DType::kFloat32, {slots_, s_.H, L_}),
                       cursors.view(DType::kInt32, {slots_})};
  }

  // The oracle's step on the host inputs: fp64 state, reference backend. Returns its out.
  std::vector<float> oracle_step() {
    auto host = [](const DeviceArray& a, DType t, std::initializer_list<int64_t> dims) {
      return TensorView::contiguous(const_cast<float*>(a.host.data()), t, dims);
    };
    std::vector<float> expected(out.host.size());
    Mamba2Step st;
    st.x = host(x, DType::kFloat32, {batch_, s_.H, s_.P});
    st.dt = host(dt, DType::kFloat32, {batch_, s_.H});
    st.A = host(A, DType::kFloat32, {s_.H});
    st.B = host(B, DType::kFloat32, {batch_, s_.G, s_.N});
    st.C = host(C, DType::kFloat32, {batch_, s_.G, s_.N});
    st.D = host(D, DType::kFloat32, {s_.H});
    st.z = host(z, DType::kFloat32, {batch_, s_.H, s_.P});
    st.dt_bias = host(dt_bias, DType::kFloat32, {s_.H});
    st.dt_softplus = true;
    st.state_batch_indices = host(indices, DType::kInt32, {batch_});
    st.pad_slot_id = kPad;
    st.out = TensorView::contiguous(expected.data(), DType::kFloat32, {batch_, s_.H, s_.P});
    const TensorView s64 = TensorView::contiguous(oracle_state.data(), DType::kFloat64,
                                                  {slots_, s_.H, s_.P, s_.N});
    ExecOptions reference;
    reference.backend = Backend::kReference;
    selective_state_update(s64, st, reference);
    return expected;
  }

  // Checks out against `expected` on non-pad rows and the canary on pad rows.
  void check_out(const std::vector<float>& expected, const std::string& where) {
    const int64_t row_size = s_.H * s_.P;
    double max_ref = 0, max_err = 0;
    for (int64_t r = 0; r < batch_; ++r) {
      const bool pad = indices.ints()[r] == kPad;
      for (int64_t i = r * row_size; i < (r + 1) * row_size; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &out.host[i], 4);
        if (pad) {
          ASSERT_EQ(bits, kCanaryBits) << where << ": pad row " << r << " was written";
          continue;
        }
        ASSERT_TRUE(std::isfinite(out.host[i])) << where << ": row " << r << " element " << i;
        max_ref = std::max(max_ref, std::fabs(double(expected[i])));
        max_err = std::max(max_err, std::fabs(double(out.host[i]) - expected[i]));
      }
    }
    EXPECT_LE(max_err, kFp32Tolerance * max_ref) << where << ": relative error " << max_err / max_ref;
  }

  static constexpr int64_t kPad = -1;

 private:
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng_); }

  Shape s_;
  int64_t batch_, slots_, L_;
  std::mt19937_64 rng_;

 public:
  DeviceArray x, dt, B, C, z, A, D, dt_bias, indices, out;
  DeviceArray state, x_cache, B_cache, dt_cache, cursors;
  std::vector<double> oracle_state;
};

bool cuda_available() { return built_with_cuda() && cuda_device_count() > 0; }

// geometry, L, route, with a workspace (and WindowKernel::kSeparate: the split path)
using GraphParam = std::tuple<Shape, int64_t, ReplayRoute, bool>;

class CudaGraphTest : public ::testing::TestWithParam<GraphParam> {};

// One decode step (replay_decode + replay_advance) captured once, replayed for every step with
// fresh inputs copied into the captured buffers; rows start at different steps (pad rows until
// then, and one row always pad), so they flush at different steps and cursors advance on the
// device only.
TEST_P(CudaGraphTest, ReplayedGraphMatchesOracleAcrossFlushes) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const auto [shape, L, route, with_workspace] = GetParam();
  const int64_t batch = 6, slots = 9, steps = 3 * L + batch + 2;
  Layer layer(shape, batch, slots, L, 7 + uint64_t(L));
  DeviceArray workspace(size_t(replay_decode_workspace_bytes(batch, shape.H, shape.P) / 4));
  auto row_slot = [&](int64_t row, int64_t step) -> int32_t {
    if (row == batch - 1 || step < row) return int32_t(Layer::kPad);
    return int32_t((row * 4 + 1) % slots);  // distinct slots, some never used
  };

  cudaStream_t stream;
  TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ExecOptions options;
  options.backend = Backend::kCuda;
  options.cuda_stream = stream;
  if (with_workspace) {
    options.workspace = workspace.view(DType::kFloat32, {int64_t(workspace.host.size())});
    options.window_kernel = WindowKernel::kSeparate;
  }
  const Mamba2Step step = layer.step();
  const ReplayCache cache = layer.cache();

  cudaGraph_t graph;
  TEST_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  replay_decode(cache, step, route, options);
  replay_advance(cache.cursors, L, step.state_batch_indices, Layer::kPad, options);
  TEST_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  std::vector<int64_t> tokens(size_t(slots), 0);
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<int32_t> slots_now;
    for (int64_t r = 0; r < batch; ++r) slots_now.push_back(row_slot(r, s));
    layer.new_inputs(slots_now);
    layer.upload_inputs(stream);
    TEST_CUDA(cudaGraphLaunch(exec, stream));
    layer.out.download(stream);
    const std::vector<float> expected = layer.oracle_step();
    layer.check_out(expected, "step " + std::to_string(s));
    for (int32_t slot : slots_now)
      if (slot != Layer::kPad) ++tokens[size_t(slot)];
  }
  layer.cursors.download(stream);
  for (int64_t slot = 0; slot < slots; ++slot)
    EXPECT_EQ(layer.cursors.ints()[slot], tokens[size_t(slot)] % L) << "slot " << slot;

  TEST_CUDA(cudaGraphExecDestroy(exec));
  TEST_CUDA(cudaGraphDestroy(graph));
  TEST_CUDA(cudaStreamDestroy(stream));
}

constexpr Shape kVectorised{8, 64, 128, 2};  // 16-byte layout, two groups
constexpr Shape kWide{4, 80, 256, 1};         // wide rows, head_dim not a power of two
constexpr Shape kOdd{6, 5, 7, 3};             // generic layout

std::string graph_param_name(const ::testing::TestParamInfo<GraphParam>& info) {
  const Shape s = std::get<0>(info.param);
  const ReplayRoute route = std::get<2>(info.param);
  return "H" + std::to_string(s.H) + "P" + std::to_string(s.P) + "N" + std::to_string(s.N) + "G" +
         std::to_string(s.G) + "_L" + std::to_string(std::get<1>(info.param)) + "_" +
         (route == ReplayRoute::kAuto         ? "auto"
          : route == ReplayRoute::kOutputOnly ? "outputonly"
                                              : "stateandoutput") +
         (std::get<3>(info.param) ? "_workspace" : "");
}

// Each case without and with a workspace.
std::vector<GraphParam> graph_cases() {
  std::vector<GraphParam> cases;
  for (bool workspace : {false, true})
    for (auto [shape, L, route] : {std::tuple{kVectorised, int64_t(4), ReplayRoute::kAuto},
                                   std::tuple{kVectorised, int64_t(3), ReplayRoute::kStateAndOutput},
                                   std::tuple{kWide, int64_t(5), ReplayRoute::kOutputOnly},
                                   std::tuple{kOdd, int64_t(4), ReplayRoute::kAuto},
                                   std::tuple{kOdd, int64_t(1), ReplayRoute::kOutputOnly}})
      cases.push_back(GraphParam{shape, L, route, workspace});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaGraphTest, ::testing::ValuesIn(graph_cases()), graph_param_name);

// A batch padded far beyond its requests (most rows pad, interleaved): the baseline and ReplaySSM
// write only the rows that carry a request and leave unused slots untouched.
class CudaPaddedBatch : public ::testing::TestWithParam<bool> {};  // with a workspace

TEST_P(CudaPaddedBatch, PadRowsAndUnusedSlotsUntouched) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Shape shape = kVectorised;
  const int64_t batch = 16, slots = 8, L = 4;
  Layer layer(shape, batch, slots, L, 11);
  DeviceArray workspace(size_t(replay_decode_workspace_bytes(batch, shape.H, shape.P) / 4));
  std::vector<int32_t> slots_now(size_t(batch), int32_t(Layer::kPad));
  for (int64_t r : {1, 6, 7, 12}) slots_now[size_t(r)] = int32_t((r * 3) % slots);
  const std::vector<float> initial_state = layer.state.host;
  ExecOptions options;
  options.backend = Backend::kCuda;
  if (GetParam()) {
    options.workspace = workspace.view(DType::kFloat32, {int64_t(workspace.host.size())});
    options.window_kernel = WindowKernel::kSeparate;
  }

  for (int64_t s = 0; s < 2 * L; ++s) {  // ReplaySSM: two windows, one flush each
    layer.new_inputs(slots_now);
    layer.upload_inputs(nullptr);
    replay_decode(layer.cache(), layer.step(), ReplayRoute::kAuto, options);
    replay_advance(layer.cache().cursors, L, layer.step().state_batch_indices, Layer::kPad, options);
    layer.out.download(nullptr);
    layer.check_out(layer.oracle_step(), "replay step " + std::to_string(s));
  }
  layer.new_inputs(slots_now);  // the baseline, on the flushed checkpoints
  layer.upload_inputs(nullptr);
  selective_state_update(layer.cache().state, layer.step(), options);
  layer.out.download(nullptr);
  layer.check_out(layer.oracle_step(), "baseline");

  layer.state.download(nullptr);
  const int64_t slot_size = shape.H * shape.P * shape.N;
  for (int64_t slot = 0; slot < slots; ++slot) {
    bool used = false;
    for (int32_t s : slots_now) used = used || s == slot;
    if (used) continue;
    for (int64_t i = slot * slot_size; i < (slot + 1) * slot_size; ++i)
      ASSERT_EQ(layer.state.host[i], initial_state[i]) << "unused slot " << slot << " was written";
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaPaddedBatch, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "workspace" : "fused");
                         });

// A workspace too small for the call, or misaligned, is refused with its numbers before anything
// is written.
TEST(CudaWorkspace, TooSmallOrMisalignedIsRefusedAndNothingWritten) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Shape shape = kVectorised;
  const int64_t batch = 4, slots = 4, L = 4;
  Layer layer(shape, batch, slots, L, 13);
  layer.new_inputs({0, 1, 2, 3});
  layer.upload_inputs(nullptr);
  const int64_t needed = replay_decode_workspace_bytes(batch, shape.H, shape.P);
  EXPECT_EQ(needed, 4 * batch * shape.H * shape.P);  // one float a (row, head, head_dim row)
  DeviceArray memory(size_t(needed / 4 + 4));
  ExecOptions options;
  options.backend = Backend::kCuda;
  auto expect_refused = [&](const TensorView& workspace, const std::string& message) {
    options.workspace = workspace;
    try {
      replay_decode(layer.cache(), layer.step(), ReplayRoute::kAuto, options);
      ADD_FAILURE() << "accepted: " << message;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
    TEST_CUDA(cudaDeviceSynchronize());
  };
  expect_refused(memory.view(DType::kInt8, {needed - 1}),
                 "workspace holds " + std::to_string(needed - 1) + " bytes but batch=4, nheads=8, "
                 "head_dim=64 need " + std::to_string(needed));
  TensorView shifted = memory.view(DType::kInt8, {needed + 8});
  shifted.data = static_cast<char*>(shifted.data) + 4;
  shifted.shape[0] = needed;
  expect_refused(shifted, "workspace must be 16-byte aligned");
  for (DeviceArray* a : {&layer.out, &layer.state, &layer.x_cache, &layer.cursors}) {
    const std::vector<float> before = a->host;
    a->download(nullptr);
    EXPECT_EQ(std::memcmp(before.data(), a->host.data(), 4 * before.size()), 0);
  }
}

}  // namespace
}  // namespace replayssm
