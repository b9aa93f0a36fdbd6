// Tuning driver for the CUDA decode kernels: times the baseline and ReplaySSM at forced launch
// configurations (rows of head_dim per CTA, route; the replay as the single kernel, "fused", and
// as the split path with a workspace, "split"), with the method of `replayssm bench`: whole
// windows of L steps captured in CUDA graphs, layer copies rotated past twice the L2, rows
// desynchronised, medians, copy bandwidth measured in the same run.
//
//   replayssm_cuda_kernels STATE ACT L BATCHES ROWS [ROUTE] [H P N G]
//   e.g. replayssm_cuda_kernels fp32 bf16 16 1,8,32,128 0,16,32,64 output-only
// ROWS lists rows_per_cta values (0: the automatic choice); ROUTE is auto, output-only or
// state-and-output; the geometry defaults to Nemotron-H (128 64 128 8).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "api/validate.hpp"
#include "byte_model.hpp"
#include "cuda/check.hpp"
#include "cuda/mamba2_cuda.hpp"

namespace replayssm {
namespace {

constexpr int kWindows = 15;
constexpr int64_t kCopyBytes = int64_t(2) << 30;

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> values;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) values.push_back(std::stoll(item));
  return values;
}

DType parse_dtype(const std::string& s) {
  if (s == "fp32") return DType::kFloat32;
  if (s == "fp16") return DType::kFloat16;
  if (s == "bf16") return DType::kBFloat16;
  throw InvalidArgument("unknown dtype " + s);
}

ReplayRoute parse_route(const std::string& s) {
  if (s == "output-only") return ReplayRoute::kOutputOnly;
  if (s == "state-and-output") return ReplayRoute::kStateAndOutput;
  return ReplayRoute::kAuto;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Device memory filled with a non-zero pattern (byte 0x3c: about 0.0115 in fp32, fp16 and bf16).
class DeviceMemory {
 public:
  DeviceMemory(DType dtype, std::initializer_list<int64_t> dims)
      : view_(TensorView::contiguous(nullptr, dtype, dims, Device{DeviceType::kCuda, 0})) {
    const size_t bytes = size_t(view_.numel() * dtype_size(dtype));
    REPLAYSSM_CUDA_CHECK(cudaMalloc(&view_.data, bytes));
    REPLAYSSM_CUDA_CHECK(cudaMemset(view_.data, 0x3c, bytes));
  }
  ~DeviceMemory() { cudaFree(view_.data); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  const TensorView& view() const { return view_; }

 private:
  TensorView view_;
};

struct LayerCache {
  LayerCache(DType state_dtype, DType act, int64_t B, int64_t H, int64_t P, int64_t N, int64_t G,
             int64_t L)
      : state(state_dtype, {B, H, P, N}), x_cache(act, {B, H, L, P}), B_cache(act, {B, G, L, N}),
        dt_cache(DType::kFloat32, {B, H, L}) {}
  DeviceMemory state, x_cache, B_cache, dt_cache;
};

class GraphTimer {
 public:
  template <typename Record> GraphTimer(cudaStream_t stream, Record&& record) : stream_(stream) {
    REPLAYSSM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    record();
    cudaGraph_t graph;
    REPLAYSSM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    REPLAYSSM_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph, 0));
    REPLAYSSM_CUDA_CHECK(cudaGraphDestroy(graph));
    REPLAYSSM_CUDA_CHECK(cudaEventCreate(&start_));
    REPLAYSSM_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~GraphTimer() {
    cudaGraphExecDestroy(exec_);
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  double seconds() const {
    REPLAYSSM_CUDA_CHECK(cudaEventRecord(start_, stream_));
    REPLAYSSM_CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
    REPLAYSSM_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    REPLAYSSM_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    REPLAYSSM_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms * 1e-3;
  }

 private:
  cudaStream_t stream_;
  cudaGraphExec_t exec_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// cudaMemcpyAsync device to device on the stream (a copy captured in a graph runs slower).
double copy_bandwidth(cudaStream_t stream) {
  DeviceMemory a(DType::kInt32, {kCopyBytes / 4}), b(DType::kInt32, {kCopyBytes / 4});
  cudaEvent_t start, stop;
  REPLAYSSM_CUDA_CHECK(cudaEventCreate(&start));
  REPLAYSSM_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> rates;
  for (int i = 0; i <= kWindows; ++i) {
    REPLAYSSM_CUDA_CHECK(cudaEventRecord(start, stream));
    REPLAYSSM_CUDA_CHECK(cudaMemcpyAsync(b.view().data, a.view().data, size_t(kCopyBytes),
                                         cudaMemcpyDeviceToDevice, stream));
    REPLAYSSM_CUDA_CHECK(cudaEventRecord(stop, stream));
    REPLAYSSM_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    REPLAYSSM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (i > 0) rates.push_back(2.0 * kCopyBytes / (ms * 1e-3));
  }
  REPLAYSSM_CUDA_CHECK(cudaEventDestroy(start));
  REPLAYSSM_CUDA_CHECK(cudaEventDestroy(stop));
  return *std::max_element(rates.begin(), rates.end());
}

int run(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s STATE ACT L BATCHES ROWS [ROUTE] [H P N G]\n", argv[0]);
    return 2;
  }
  const DType state_dtype = parse_dtype(argv[1]), act = parse_dtype(argv[2]);
  const int64_t L = std::stoll(argv[3]);
  const std::vector<int64_t> batches = parse_list(argv[4]), rows_list = parse_list(argv[5]);
  const ReplayRoute route = argc > 6 ? parse_route(argv[6]) : ReplayRoute::kAuto;
  tool::Geometry g{"nemotron-h", 128, 64, 128, 8};
  if (argc > 10) g = {"custom", std::stoll(argv[7]), std::stoll(argv[8]), std::stoll(argv[9]), std::stoll(argv[10])};
  const int64_t H = g.heads, P = g.head_dim, N = g.state_dim, G = g.groups;

  cudaStream_t stream;
  REPLAYSSM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int l2 = 0;
  REPLAYSSM_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  const double copy = copy_bandwidth(stream);
  std::printf("copy bandwidth %.1f GB/s; %s state, %s act, L=%lld, route %s\n", copy / 1e9,
              argv[1], argv[2], (long long)L, route_name(route));
  std::printf("%6s %5s %6s | %9s %6s | %9s %6s %7s | %9s %6s %7s\n", "batch", "rows", "layers",
              "base us", "%copy", "fused us", "%copy", "speedup", "split us", "%copy", "speedup");

  for (const int64_t batch : batches) {
    const int64_t state_bytes = batch * H * P * N * dtype_size(state_dtype);
    const int64_t layers =
        tool::cold_layer_copies(l2, state_bytes, batch * int64_t(tool::history_slot_bytes(g, L, act)));
    std::vector<std::unique_ptr<LayerCache>> caches;
    for (int64_t i = 0; i < layers; ++i)
      caches.push_back(std::make_unique<LayerCache>(state_dtype, act, batch, H, P, N, G, L));
    DeviceMemory x(act, {batch, H, P}), dt(act, {batch, H}), Bm(act, {batch, G, N}),
        C(act, {batch, G, N}), z(act, {batch, H, P}), out(act, {batch, H, P}),
        A(DType::kFloat32, {H}), D(DType::kFloat32, {H}), dt_bias(DType::kFloat32, {H}),
        indices(DType::kInt32, {batch}), cursors(DType::kInt32, {batch});
    std::vector<int32_t> host(static_cast<size_t>(batch));
    for (int64_t r = 0; r < batch; ++r) host[size_t(r)] = int32_t(r);
    REPLAYSSM_CUDA_CHECK(cudaMemcpy(indices.view().data, host.data(), 4 * batch, cudaMemcpyHostToDevice));
    for (int64_t r = 0; r < batch; ++r) host[size_t(r)] = int32_t(r % L);
    REPLAYSSM_CUDA_CHECK(cudaMemcpy(cursors.view().data, host.data(), 4 * batch, cudaMemcpyHostToDevice));
    std::vector<float> minus_one(size_t(H), -1.f);
    REPLAYSSM_CUDA_CHECK(cudaMemcpy(A.view().data, minus_one.data(), 4 * H, cudaMemcpyHostToDevice));

    Mamba2Step step;
    step.x = x.view();
    step.dt = dt.view();
    step.A = A.view();
    step.B = Bm.view();
    step.C = C.view();
    step.D = D.view();
    step.z = z.view();
    step.dt_bias = dt_bias.view();
    step.dt_softplus = true;
    step.state_batch_indices = indices.view();
    step.out = out.view();
    const CursorParams advance =
        validate_advance(cursors.view(), L, indices.view(), -1, Backend::kCuda);
    DeviceMemory workspace(DType::kInt8, {replay_decode_workspace_bytes(batch, H, P)});
    std::vector<ReplayParams> params;
    for (const auto& c : caches) {
      ReplayCache cache{c->state.view(), c->x_cache.view(), c->B_cache.view(), c->dt_cache.view(),
                        cursors.view()};
      params.push_back(validate_replay_decode(cache, step, route, Backend::kCuda, workspace.view()));
    }

    for (const int64_t rows : rows_list) {
      const cuda::LaunchConfig config{int(rows)};
      GraphTimer baseline(stream, [&] {
        for (int64_t s = 0; s < L; ++s)
          for (const ReplayParams& p : params) cuda::selective_state_update(p, config, stream);
      });
      auto replay_timer = [&](int window_kernel) {
        const cuda::LaunchConfig replay_config{int(rows), window_kernel};
        return std::make_unique<GraphTimer>(stream, [&] {
          for (int64_t s = 0; s < L; ++s) {
            for (const ReplayParams& p : params) cuda::replay_decode(p, replay_config, stream);
            cuda::replay_advance(advance, stream);
          }
        });
      };
      const auto fused = replay_timer(0), split = replay_timer(1);
      std::vector<double> base_s, fused_s, split_s;
      baseline.seconds();
      fused->seconds();
      split->seconds();
      for (int w = 0; w < kWindows; ++w) {
        base_s.push_back(baseline.seconds());
        fused_s.push_back(fused->seconds());
        split_s.push_back(split->seconds());
      }
      const double steps = double(L * layers);
      const double base_step = median(base_s) / steps, fused_step = median(fused_s) / steps,
                   replay_step = median(split_s) / steps;
      const double base_bytes = tool::baseline_bytes_per_step(g, batch, state_dtype, act);
      const double replay_bytes = tool::replay_bytes_per_step(g, batch, L, state_dtype, act);
      const int shown_rows = rows > 0 ? int(rows) : cuda::auto_launch_config(params.front()).rows_per_cta;
      std::printf("%6lld %4d%s %6lld | %9.2f %5.1f%% | %9.2f %5.1f%% %6.3fx | %9.2f %5.1f%% %6.3fx\n",
                  (long long)batch, shown_rows, rows > 0 ? " " : "*", (long long)layers,
                  base_step * 1e6, 100 * base_bytes / base_step / copy, fused_step * 1e6,
                  100 * replay_bytes / fused_step / copy, base_step / fused_step,
                  replay_step * 1e6, 100 * replay_bytes / replay_step / copy, base_step / replay_step);
      std::fflush(stdout);
    }
  }
  REPLAYSSM_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace replayssm

int main(int argc, char** argv) {
  try {
    return replayssm::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
