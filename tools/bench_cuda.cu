// `replayssm bench --device cuda`: whole windows captured in CUDA graphs and replayed, enough
// layer copies rotated to defeat the L2, medians, and the device-to-device copy bandwidth measured
// in the same run.
//
// A window is L model steps; each step runs every layer copy (replay_decode, or
// selective_state_update for the baseline) and then one replay_advance, since all the layers of a
// model share one cursors tensor. Rows are desynchronised (row r starts at cursor r % L), so every
// row flushes once per window, at different steps.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench.hpp"
#include "byte_model.hpp"
#include "spec_bench.hpp"
#include "replayssm/error.hpp"
#include "replayssm/mamba2_spec.hpp"
#include "workload.hpp"

namespace replayssm::tool {
namespace {

constexpr int64_t kCopyBufferBytes = int64_t(2) << 30;
constexpr int kCopyRepetitions = 21;
constexpr uint64_t kSeed = 1;

// A layer's history caches: `positions` inputs of every slot.
int64_t history_bytes(const Geometry& g, int64_t slots, int64_t positions, DType act) {
  return slots * int64_t(history_slot_bytes(g, positions, act));
}

void check(cudaError_t status, const char* call, int line) {
  if (status != cudaSuccess)
    throw CudaError(std::string(call) + " failed: " + cudaGetErrorString(status) + " (" +
                    __FILE__ + ":" + std::to_string(line) + ")");
}

#define BENCH_CUDA_CHECK(call) check((call), #call, __LINE__)

// Uniform values in [lo, hi) from a counter-based hash: fills large device tensors without a host
// copy.
template <typename T>
__global__ void fill_uniform_kernel(T* data, int64_t count, uint64_t seed, float lo, float hi) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = seed + uint64_t(i) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float u = float(z >> 40) * (1.0f / float(1 << 24));
    data[i] = from_float<T>(lo + (hi - lo) * u);
  }
}

void fill_uniform(const Tensor& t, uint64_t seed, float lo, float hi) {
  const TensorView& v = t.view();
  const int64_t n = v.numel();
  constexpr int kThreads = 256, kBlocks = 4096;
  switch (v.dtype) {
    case DType::kFloat16:
      fill_uniform_kernel<<<kBlocks, kThreads>>>(static_cast<Half*>(v.data), n, seed, lo, hi);
      break;
    case DType::kBFloat16:
      fill_uniform_kernel<<<kBlocks, kThreads>>>(static_cast<BFloat16*>(v.data), n, seed, lo, hi);
      break;
    case DType::kInt8:
      fill_uniform_kernel<<<kBlocks, kThreads>>>(static_cast<Int8*>(v.data), n, seed, lo, hi);
      break;
    case DType::kFloat8E4M3:
      fill_uniform_kernel<<<kBlocks, kThreads>>>(static_cast<Float8E4M3*>(v.data), n, seed, lo, hi);
      break;
    default:
      fill_uniform_kernel<<<kBlocks, kThreads>>>(static_cast<float*>(v.data), n, seed, lo, hi);
      break;
  }
  BENCH_CUDA_CHECK(cudaGetLastError());
}

class Graph {
 public:
  // Captures `record(stream)` on `stream`.
  template <typename Record> Graph(cudaStream_t stream, Record&& record) {
    BENCH_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    record();
    cudaGraph_t graph = nullptr;
    BENCH_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    const cudaError_t status = cudaGraphInstantiate(&exec_, graph, 0);
    cudaGraphDestroy(graph);
    BENCH_CUDA_CHECK(status);
  }
  ~Graph() { cudaGraphExecDestroy(exec_); }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Seconds one replay takes on `stream`, between two events.
  double time(cudaStream_t stream, cudaEvent_t start, cudaEvent_t stop) const {
    BENCH_CUDA_CHECK(cudaEventRecord(start, stream));
    BENCH_CUDA_CHECK(cudaGraphLaunch(exec_, stream));
    BENCH_CUDA_CHECK(cudaEventRecord(stop, stream));
    BENCH_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ms * 1e-3;
  }

 private:
  cudaGraphExec_t exec_ = nullptr;
};

// The stream and the two timing events of a measurement.
struct Timer {
  Timer() {
    BENCH_CUDA_CHECK(cudaSetDevice(0));
    BENCH_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    BENCH_CUDA_CHECK(cudaEventCreate(&start));
    BENCH_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~Timer() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaStreamDestroy(stream);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
};

}  // namespace

CopyBandwidth measure_cuda_copy_bandwidth() {
  Timer timer;
  void *src = nullptr, *dst = nullptr;
  BENCH_CUDA_CHECK(cudaMalloc(&src, size_t(kCopyBufferBytes)));
  BENCH_CUDA_CHECK(cudaMalloc(&dst, size_t(kCopyBufferBytes)));
  BENCH_CUDA_CHECK(cudaMemset(src, 1, size_t(kCopyBufferBytes)));
  CopyBandwidth result;
  result.buffer_bytes = kCopyBufferBytes;
  result.repetitions = kCopyRepetitions;
  std::vector<double> rates;
  for (int r = 0; r <= kCopyRepetitions; ++r) {  // the first copy warms up
    BENCH_CUDA_CHECK(cudaEventRecord(timer.start, timer.stream));
    BENCH_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(kCopyBufferBytes), cudaMemcpyDeviceToDevice,
                                     timer.stream));
    BENCH_CUDA_CHECK(cudaEventRecord(timer.stop, timer.stream));
    BENCH_CUDA_CHECK(cudaEventSynchronize(timer.stop));
    float ms = 0;
    BENCH_CUDA_CHECK(cudaEventElapsedTime(&ms, timer.start, timer.stop));
    if (r > 0) rates.push_back(2.0 * double(kCopyBufferBytes) / (ms * 1e-3));
  }
  BENCH_CUDA_CHECK(cudaFree(src));
  BENCH_CUDA_CHECK(cudaFree(dst));
  result.best_bytes_per_s = *std::max_element(rates.begin(), rates.end());
  result.median_bytes_per_s = median(rates);
  return result;
}

ConfigTiming time_cuda_configuration(const BenchConfig& config) {
  Timer timer;
  int l2_bytes = 0;
  BENCH_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0));
  const int64_t layer_state_bytes = state_bytes(config);

  ConfigTiming timing;
  timing.layers = cold_layer_copies(l2_bytes, layer_state_bytes,
                              history_bytes(config.geometry, config.batch, config.buffer_len, config.act_dtype));
  timing.rotated_state_bytes = timing.layers * layer_state_bytes;
  timing.cold_bytes = cold_state_bytes(l2_bytes);
  const std::unique_ptr<Memory> memory = make_cuda_memory();
  uint64_t seed = kSeed;
  const BenchModel model(*memory, config, timing.layers, [&](Tensor& t, double lo, double hi) {
    fill_uniform(t, seed += 16, float(lo), float(hi));
  });
  BENCH_CUDA_CHECK(cudaDeviceSynchronize());

  // The replay gets a workspace, as a serving engine would give it (one for every layer).
  const Geometry& g = config.geometry;
  const Tensor workspace(*memory, DType::kInt8,
                         {replay_decode_workspace_bytes(config.batch, g.heads, g.head_dim)});
  ExecOptions options;
  options.backend = Backend::kCuda;
  options.cuda_stream = timer.stream;
  options.workspace = workspace.view();
  options.window_kernel = config.window_kernel;
  const Graph baseline(timer.stream, [&] {
    for (int64_t s = 0; s < config.buffer_len; ++s) model.baseline_step(options);
  });
  const Graph replay(timer.stream, [&] {
    for (int64_t s = 0; s < config.buffer_len; ++s) model.replay_step(options);
  });

  // Where the baseline has no state of its own it overwrites the checkpoints ReplaySSM uses:
  // timing does not depend on the values, and both keep them bounded.
  time_alternating(timing, config.windows, double(config.buffer_len * timing.layers), [&](bool replay_window) {
    return (replay_window ? replay : baseline).time(timer.stream, timer.start, timer.stop);
  });
  return timing;
}

// Speculative decoding: a window is L verify steps; each replays every layer copy (spec_verify,
// or spec_state_update for the baseline), then ReplaySSM commits the shared ring once.
ConfigTiming time_cuda_spec_configuration(const SpecBenchConfig& config) {
  Timer timer;
  int l2_bytes = 0;
  BENCH_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0));
  const int64_t layer_bytes = spec_layer_state_bytes(config);
  ConfigTiming timing;
  timing.cold_bytes = cold_state_bytes(l2_bytes);
  timing.layers = cold_layer_copies(l2_bytes, layer_bytes,
                              history_bytes(config.geometry, config.batch,
                                            spec_ring_len(config.buffer_len, config.window), config.act_dtype));
  timing.rotated_state_bytes = timing.layers * layer_bytes;
  const std::unique_ptr<Memory> memory = make_cuda_memory();
  const SpecPlan plan = plan_spec(config);
  uint64_t seed = kSeed;
  const SpecModel model(*memory, config, plan, timing.layers, [&](Tensor& t, double lo, double hi) {
    fill_uniform(t, seed += 16, float(lo), float(hi));
  });
  BENCH_CUDA_CHECK(cudaDeviceSynchronize());

  // ReplaySSM gets a workspace, as for standard decode (one for every layer).
  const Geometry& g = config.geometry;
  const Tensor workspace(*memory, DType::kInt8,
                         {spec_verify_workspace_bytes(config.batch, config.window, g.heads, g.head_dim)});
  ExecOptions options;
  options.backend = Backend::kCuda;
  options.cuda_stream = timer.stream;
  options.workspace = workspace.view();
  options.window_kernel = config.window_kernel;
  const Graph baseline(timer.stream, [&] {
    for (int64_t s = 0; s < model.steps; ++s) model.baseline_step(s, options);
  });
  const Graph replay(timer.stream, [&] {
    for (int64_t s = 0; s < model.steps; ++s) model.replay_step(s, options);
  });
  time_alternating(timing, config.windows, double(model.steps * timing.layers), [&](bool replay_window) {
    return (replay_window ? replay : baseline).time(timer.stream, timer.start, timer.stop);
  });
  return timing;
}

}  // namespace replayssm::tool
