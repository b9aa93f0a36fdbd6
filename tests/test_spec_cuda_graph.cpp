// CUDA only (skipped without a device): speculative verify + commit steps captured in one CUDA
// graph, with a different accepted count per row and step, replayed across several flushes; the
// graph must leave exactly what the same calls leave when run eagerly. Without and with a
// workspace (the split path). And the refusal of a workspace too small or misaligned.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "replayssm/error.hpp"
#include "replayssm/mamba2_spec.hpp"
#include "support/buffer.hpp"
#include "support/host_tensor.hpp"

namespace replayssm::test {
namespace {

void check_cuda(cudaError_t status, const char* call) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(status));
}
#define TEST_CUDA(call) check_cuda((call), #call)

constexpr int64_t H = 8, P = 16, N = 128, G = 2, T = 4, L = 16, kBatch = 3, kSlots = 4, kSteps = 5;
constexpr Device kGpu{DeviceType::kCuda, 0};

Buffer random_buffer(DType dtype, int64_t count, std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> value(lo, hi);
  HostTensor t(dtype, {count});
  for (int64_t i = 0; i < count; ++i) t.set(i, value(rng));
  return upload_copy(kGpu, t);
}

Buffer int_buffer(const std::vector<int32_t>& values) {
  Buffer b(kGpu, values.size() * 4);
  b.upload(values.data(), 0, b.bytes());
  return b;
}

// One layer's cache and a model step's window; rows 0 and 2 map to slots 2 and 0, row 1 is padding.
// With a workspace, verify takes the split path (N = 128 is one of its layouts).
struct SpecLayer {
  SpecLayer(uint64_t seed, bool with_workspace) : rng(seed) {
    if (with_workspace) workspace = Buffer(kGpu, size_t(spec_verify_workspace_bytes(kBatch, T, H, P)));
    const int64_t R = spec_ring_len(L, T);
    state = random_buffer(DType::kFloat32, kSlots * H * P * N, rng, -1, 1);
    x_cache = random_buffer(DType::kBFloat16, kSlots * H * R * P, rng, -1, 1);
    B_cache = random_buffer(DType::kBFloat16, kSlots * G * R * N, rng, -1, 1);
    dt_cache = random_buffer(DType::kFloat32, kSlots * H * R, rng, -1, 1);
    ring = int_buffer(std::vector<int32_t>(size_t(2 * kSlots), 0));
    x = random_buffer(DType::kBFloat16, kBatch * T * H * P, rng, -1, 1);
    z = random_buffer(DType::kBFloat16, kBatch * T * H * P, rng, -1, 1);
    dt = random_buffer(DType::kBFloat16, kBatch * T * H, rng, -3, -1);
    B = random_buffer(DType::kBFloat16, kBatch * T * G * N, rng, -1, 1);
    C = random_buffer(DType::kBFloat16, kBatch * T * G * N, rng, -1, 1);
    A = random_buffer(DType::kFloat32, H, rng, -8, -0.5);
    D = random_buffer(DType::kFloat32, H, rng, -1, 1);
    dt_bias = random_buffer(DType::kFloat32, H, rng, -1, 1);
    out = Buffer(kGpu, size_t(kBatch * T * H * P * 2));
    indices = int_buffer({2, -1, 0});
    valid = int_buffer({4, 1, 3});
  }

  SpecCache cache() const {
    const int64_t R = spec_ring_len(L, T);
    return SpecCache{state.view(DType::kFloat32, {kSlots, H, P, N}),
                     x_cache.view(DType::kBFloat16, {kSlots, H, R, P}),
                     B_cache.view(DType::kBFloat16, {kSlots, G, R, N}),
                     dt_cache.view(DType::kFloat32, {kSlots, H, R}), ring.view(DType::kInt32, {kSlots, 2})};
  }

  Mamba2Window window() const {
    Mamba2Window w;
    w.x = x.view(DType::kBFloat16, {kBatch, T, H, P});
    w.dt = dt.view(DType::kBFloat16, {kBatch, T, H});
    w.A = A.view(DType::kFloat32, {H});
    w.B = B.view(DType::kBFloat16, {kBatch, T, G, N});
    w.C = C.view(DType::kBFloat16, {kBatch, T, G, N});
    w.D = D.view(DType::kFloat32, {H});
    w.z = z.view(DType::kBFloat16, {kBatch, T, H, P});
    w.dt_bias = dt_bias.view(DType::kFloat32, {H});
    w.dt_softplus = true;
    w.num_valid_tokens = valid.view(DType::kInt32, {kBatch});
    w.state_batch_indices = indices.view(DType::kInt32, {kBatch});
    w.out = out.view(DType::kBFloat16, {kBatch, T, H, P});
    return w;
  }

  // Model step s: verify, then commit the step's accepted counts.
  void step(const Buffer& accepted, int64_t s, cudaStream_t stream) const {
    const ExecOptions options{Backend::kCuda, stream};
    spec_verify(cache(), window(), L, verify_options(stream));
    const TensorView counts = accepted.view(DType::kInt32, {kBatch}, {}, s * kBatch);
    spec_commit(cache().ring, counts, T, L, indices.view(DType::kInt32, {kBatch}), -1, options);
  }

  ExecOptions verify_options(cudaStream_t stream) const {
    ExecOptions options{Backend::kCuda, stream};
    if (workspace.bytes() > 0) {
      options.workspace = workspace.view(DType::kInt8, {int64_t(workspace.bytes())});
      options.window_kernel = WindowKernel::kSeparate;
    }
    return options;
  }

  std::vector<std::vector<uint8_t>> contents() const {
    return {state.download(), x_cache.download(), B_cache.download(), dt_cache.download(), ring.download(),
            out.download()};
  }

  std::mt19937_64 rng;
  Buffer state, x_cache, B_cache, dt_cache, ring, x, z, dt, B, C, A, D, dt_bias, out, indices, valid, workspace;
};

class SpecCudaGraph : public ::testing::TestWithParam<bool> {};  // with a workspace

TEST_P(SpecCudaGraph, ReplaysExactlyWhatTheEagerCallsDo) {
  REPLAYSSM_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  // Accepted counts per (step, row), within each row's valid tokens {4, 1, 3}: all, bonus only, mixed.
  const Buffer accepted = int_buffer({4, 1, 1, 1, 1, 3, 2, 1, 2, 4, 1, 1, 3, 1, 3});
  const SpecLayer eager(7, GetParam()), graphed(7, GetParam());
  const std::vector<uint8_t> initial_state = graphed.state.download();
  cudaStream_t stream;
  TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  TEST_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int64_t s = 0; s < kSteps; ++s) graphed.step(accepted, s, stream);
  TEST_CUDA(cudaStreamEndCapture(stream, &graph));
  TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  // Three replays: 15 verify steps, several flushes per row (L = 16, T = 4).
  for (int replay = 0; replay < 3; ++replay) {
    TEST_CUDA(cudaGraphLaunch(exec, stream));
    for (int64_t s = 0; s < kSteps; ++s) eager.step(accepted, s, stream);
    TEST_CUDA(cudaStreamSynchronize(stream));
    const auto a = eager.contents(), b = graphed.contents();
    const char* names[] = {"state", "x_cache", "B_cache", "dt_cache", "ring", "out"};
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i] == b[i]) << names[i] << " after replay " << replay;
  }
  // Row 0 committed 42 tokens into slot 2 (L = 16): its checkpoint must have been rewritten. (Its
  // ring origin is no witness: it moves by the folded count modulo the ring length.)
  const std::vector<uint8_t> state_now = graphed.state.download();
  const size_t slot_bytes = size_t(H * P * N * 4);
  EXPECT_FALSE(std::equal(state_now.begin() + 2 * slot_bytes, state_now.begin() + 3 * slot_bytes,
                          initial_state.begin() + 2 * slot_bytes))
      << "slot 2 never flushed: its checkpoint is unchanged";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Paths, SpecCudaGraph, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "workspace" : "fused");
                         });

// A workspace too small for the call, or misaligned, is refused with its numbers before anything
// is written.
TEST(SpecCudaWorkspace, TooSmallOrMisalignedIsRefusedAndNothingWritten) {
  REPLAYSSM_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  const SpecLayer layer(11, false);
  const int64_t needed = spec_verify_workspace_bytes(kBatch, T, H, P);
  EXPECT_EQ(needed, 4 * kBatch * T * H * P);  // one float a (row, position, head, head_dim row)
  const Buffer memory(kGpu, size_t(needed + 16));
  const auto before = layer.contents();
  auto expect_refused = [&](const TensorView& workspace, const std::string& message) {
    ExecOptions options{Backend::kCuda, nullptr};
    options.workspace = workspace;
    try {
      spec_verify(layer.cache(), layer.window(), L, options);
      ADD_FAILURE() << "accepted: " << message;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  expect_refused(memory.view(DType::kInt8, {needed - 1}),
                 "workspace holds " + std::to_string(needed - 1) + " bytes but batch=3, window=4, nheads=8, "
                 "head_dim=16 need " + std::to_string(needed) + " (spec_verify_workspace_bytes)");
  TensorView shifted = memory.view(DType::kInt8, {needed + 8});
  shifted.data = static_cast<char*>(shifted.data) + 4;
  shifted.shape[0] = needed;
  expect_refused(shifted, "workspace must be 16-byte aligned");
  TEST_CUDA(cudaDeviceSynchronize());
  EXPECT_TRUE(layer.contents() == before) << "a refused call wrote to the cache or the output";
}

}  // namespace
}  // namespace replayssm::test
