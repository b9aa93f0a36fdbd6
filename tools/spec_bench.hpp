// `replayssm bench --spec T`: speculative decoding, one verify step of T tokens per row. The
// workload (a model of rotated layer copies sharing one ring tensor and one sequence of accepted
// counts) is built on any Memory; spec_bench.cpp times it on the CPU, bench_cuda.cu in CUDA
// graphs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench.hpp"
#include "geometry.hpp"
#include "replayssm/mamba2_spec.hpp"
#include "workload.hpp"

namespace replayssm::tool {

// How many tokens of each verify window are accepted (the bonus token included).
struct AcceptanceModel {
  bool fixed = true;  // fixed: every row accepts `value` tokens (at most T) every step
  double value = 0;   // fixed: K; otherwise the mean M in [1, T] of k = 1 + Binomial(T - 1, (M-1)/(T-1))
  std::string describe() const;  // "fixed:4", "mean:2.5"
};

// "fixed:K" or "mean:M"; throws UsageError.
AcceptanceModel parse_acceptance(const std::string& flag, const std::string& text);

struct SpecBenchConfig {
  Geometry geometry;
  int64_t batch = 1;
  int64_t window = 4;       // T
  int64_t buffer_len = 16;  // L
  DType state_dtype = DType::kFloat32;
  DType act_dtype = DType::kBFloat16;
  AcceptanceModel acceptance;
  int windows = 5;
  WindowKernel window_kernel = WindowKernel::kAuto;  // CUDA: the verify's path (it gets a workspace)
};

// The accepted counts of one timed window (steps, batch) and the rings the rows start from
// (desynchronised), with what the ring rule makes of them: flushes per verify step and the mean
// committed history a verify replays (the byte model's f and w).
struct SpecPlan {
  int64_t steps = 0;
  std::vector<double> accepted;    // (steps, batch)
  std::vector<double> start_ring;  // (batch, 2)
  double flushes_per_step = 0, mean_history = 0;
};

SpecPlan plan_spec(const SpecBenchConfig& config);

// One layer copy: window inputs, ReplaySSM's checkpoint and ring caches, the baseline's T states
// per row, and the outputs of each path.
struct SpecLayer {
  SpecLayer(Memory& memory, const SpecBenchConfig& config, Random& random, const FillUniform& fill_large);
  Tensor x, z, out, baseline_out;  // (batch, T, H, P) act
  Tensor dt;                       // (batch, T, H) act
  Tensor B, C;                     // (batch, T, G, N) act
  Tensor A, D, dt_bias;            // (H) fp32
  Tensor checkpoint;               // (batch, H, P, N) state
  Tensor x_cache;                  // (batch, H, R, P) act
  Tensor B_cache;                  // (batch, G, R, N) act
  Tensor dt_cache;                 // (batch, H, R) fp32
  Tensor baseline_state;           // (batch * T, H, P, N) state
};

// The model: layer copies, and what all of them share.
struct SpecModel {
  SpecModel(Memory& memory, const SpecBenchConfig& config, const SpecPlan& plan, int64_t layers,
            const FillUniform& fill_large);
  // Verify step s of every layer copy, then one commit (ReplaySSM) / every layer copy (baseline).
  void replay_step(int64_t s, const ExecOptions& options) const;
  void baseline_step(int64_t s, const ExecOptions& options) const;

  SpecBenchConfig config;
  int64_t steps;
  std::vector<std::unique_ptr<SpecLayer>> layers;
  Tensor ring;            // (batch, 2) int32
  Tensor accepted;        // (steps, batch) int32
  Tensor slots;           // (batch) int32: row r uses slot r
  Tensor baseline_slots;  // (batch, T) int32: row r owns slots r * T .. r * T + T - 1

 private:
  Mamba2Window window(const SpecLayer& layer, bool baseline) const;
  TensorView accepted_at(int64_t s) const;
};

// Layer state bytes (checkpoint + baseline states) of one copy.
int64_t spec_layer_state_bytes(const SpecBenchConfig& config);

ConfigTiming time_spec_configuration(const SpecBenchConfig& config, DeviceType device);
// bench_cuda.cu (CUDA builds only).
ConfigTiming time_cuda_spec_configuration(const SpecBenchConfig& config);

// The --spec mode of `replayssm bench`.
int run_spec_bench(const std::vector<std::string>& argv, const std::string& command_line);

}  // namespace replayssm::tool
