// The device-specific part of `replayssm bench`: the copy bandwidth of a device and the time of a
// configuration on it. bench.cpp implements both for the CPU. A CUDA implementation (CUDA-graph
// replays of a window, cold L2, device-to-device copy bandwidth) belongs in its own .cu file,
// called from these two functions for DeviceType::kCuda.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "geometry.hpp"
#include "workload.hpp"
#include "replayssm/mamba2.hpp"

namespace replayssm::tool {

class JsonWriter;

struct BenchConfig {
  Geometry geometry;
  int64_t batch = 1;
  int64_t buffer_len = 16;  // L
  DType state_dtype = DType::kFloat32;
  DType act_dtype = DType::kBFloat16;
  ReplayRoute route = ReplayRoute::kAuto;
  int windows = 5;  // timed windows, after one warm-up window
};

// A large copy between two buffers much larger than the caches, counted as bytes read + written.
struct CopyBandwidth {
  double best_bytes_per_s = 0;
  double median_bytes_per_s = 0;
  int64_t buffer_bytes = 0;
  int repetitions = 0;
  int threads = 0;
};

// One window is L decode steps of every rotated layer copy; rows are desynchronised (row r starts
// at cursor r % L), so every row flushes once per window.
struct ConfigTiming {
  int64_t layers = 0;  // layer copies rotated so that each step reads its state from memory
  int64_t rotated_state_bytes = 0;  // the states of all layer copies
  int64_t cold_bytes = 0;  // the state that defeats the device's caches (CPU caches or GPU L2)
  std::vector<double> baseline_window_s, replay_window_s;
  double baseline_step_s = 0, replay_step_s = 0;  // median window / (L * layers)
};

// Bytes a host working set must span so that no step finds its state in a CPU cache.
int64_t cold_bytes();

// The state dtype the baseline runs with: the configuration's, or bf16 for an 8-bit checkpoint
// (selective_state_update stores no 8-bit state; bf16 is its smallest).
DType baseline_state_dtype(const BenchConfig& config);

// The layer shape of a configuration (one slot per row) and the bytes of its states.
LayerShape layer_shape(const BenchConfig& config);
int64_t state_bytes(const BenchConfig& config);

CopyBandwidth measure_copy_bandwidth(DeviceType device);
ConfigTiming time_configuration(const BenchConfig& config, DeviceType device);

// The CUDA implementations (bench_cuda.cu, CUDA builds only).
CopyBandwidth measure_cuda_copy_bandwidth();
ConfigTiming time_cuda_configuration(const BenchConfig& config);

// The JSON of a bench run: the fields every run starts with (tool, date, command line, device,
// machine, copy bandwidth; the object is left open for the run's method and results), and the
// timing of one path of one configuration.
void write_run_header(JsonWriter& json, const char* tool, const std::string& command_line,
                      DeviceType device, const CopyBandwidth& copy);
void write_timing(JsonWriter& json, double step_s, double bytes, const std::vector<double>& windows,
                  int64_t steps_per_window, const CopyBandwidth& copy);

}  // namespace replayssm::tool
