// The device-specific part of `replayssm bench`: the copy bandwidth of a device and the time of a
// configuration on it. bench.cpp implements both for the CPU. A CUDA implementation (CUDA-graph
// replays of a window, cold L2, device-to-device copy bandwidth) belongs in its own .cu file,
// called from these two functions for DeviceType::kCuda. The workload (BenchModel: rotated layer
// copies sharing one cursors tensor) is built on any Memory, so both devices time the same one.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
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
  DType state_dtype = DType::kFloat32;  // ReplaySSM's checkpoint
  DType baseline_state_dtype = DType::kFloat32;
  DType act_dtype = DType::kBFloat16;
  ReplayRoute route = ReplayRoute::kAuto;
  int windows = 5;  // timed windows, after one warm-up window
  WindowKernel window_kernel = WindowKernel::kAuto;  // CUDA: the replay's path (it gets a workspace)
};

// A large copy between two buffers much larger than the caches, counted as bytes read + written.
struct CopyBandwidth {
  double best_bytes_per_s = 0;
  double median_bytes_per_s = 0;
  int64_t buffer_bytes = 0;
  int repetitions = 0;
  int threads = 0;
};

// The timing of one configuration, standard or speculative. One window is L model steps of every
// rotated layer copy (standard decode: rows desynchronised, row r starts at cursor r % L, so every
// row flushes once per window).
struct ConfigTiming {
  int64_t layers = 0;  // layer copies rotated so that each step reads its state from memory
  int64_t rotated_state_bytes = 0;  // the states (checkpoints and baseline states) of all copies
  int64_t cold_bytes = 0;  // the state that defeats the device's caches (CPU caches or GPU L2)
  std::vector<double> baseline_window_s, replay_window_s;
  double baseline_step_s = 0, replay_step_s = 0;  // median window / layer steps per window
};

double median(std::vector<double> values);

// One warm-up window of each path, then `windows` of each alternating, so that a change in the
// machine's load hits both alike; time_window(replay) runs one window of `steps` layer steps and
// returns its seconds.
void time_alternating(ConfigTiming& timing, int windows, double steps,
                      const std::function<double(bool replay)>& time_window);

// The note printed under a row whose rotated states do not defeat the caches.
void print_cache_note(const ConfigTiming& timing);

// Closes the JSON file a bench wrote and reports it (throws when the write failed).
void finish_json(std::ofstream& file, const std::string& path);

// Bytes a host working set must span so that no step finds its state in a CPU cache.
int64_t cold_bytes();

// The state dtype the baseline runs with unless told: the checkpoint's, or bf16 for an 8-bit
// checkpoint (selective_state_update stores no 8-bit state; bf16 is its smallest).
DType default_baseline_state_dtype(DType checkpoint);

// The layer shape of a configuration (one slot per row), and the bytes of the smaller of the two
// states of a layer copy (checkpoint, baseline state): enough copies of it to defeat the caches
// make both paths read their state from memory.
LayerShape layer_shape(const BenchConfig& config);
int64_t state_bytes(const BenchConfig& config);

// Fills a tensor with uniform values in [lo, hi): on the host, or by a device kernel for the large
// per-slot tensors of a CUDA workload.
using FillUniform = std::function<void(Tensor& tensor, double lo, double hi)>;

// One layer copy: its own parameters, inputs, states, history and out; `fill_large` fills the
// per-slot tensors (states, scales, history). The cursors of its SlotCache are unused: all the
// layers of a model share one cursors tensor.
struct BenchLayer {
  BenchLayer(Memory& memory, const LayerShape& shape, const BenchConfig& config, Random& random,
             const FillUniform& fill_large);
  // The state the baseline updates.
  const Tensor& baseline() const { return baseline_state.view().defined() ? baseline_state : cache.state; }
  StepInputs inputs;
  SlotCache cache;        // ReplaySSM's checkpoint (with its scale when 8-bit) and history
  Tensor baseline_state;  // (slots, H, P, N): only where the baseline's dtype differs from the checkpoint's
  Tensor out;
};

// The model: layer copies and the cursors they share (row r starts at cursor r % L).
struct BenchModel {
  BenchModel(Memory& memory, const BenchConfig& config, int64_t layers, const FillUniform& fill_large);
  // One model step: every layer copy, then (ReplaySSM) one replay_advance of the shared cursors.
  void baseline_step(const ExecOptions& options) const;
  void replay_step(const ExecOptions& options) const;

  BenchConfig config;
  std::vector<std::unique_ptr<BenchLayer>> layers;
  Tensor cursors;  // (slots) int32
};

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
