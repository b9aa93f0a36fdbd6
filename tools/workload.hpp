// The tensors of one Mamba-2 layer for a geometry, batch, buffer length and dtypes: step inputs,
// parameters, the slot cache (state, history, cursors) and out. Buffers come from a Memory, so the
// same code runs on host memory or on a device (cuda_memory.cu).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "geometry.hpp"
#include "replayssm/mamba2.hpp"
#include "replayssm/tensor.hpp"

namespace replayssm::tool {

// Where a workload's buffers live. Allocations are zero-filled.
class Memory {
 public:
  virtual ~Memory() = default;
  virtual Device device() const = 0;
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* data) noexcept = 0;
  virtual void copy_from_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
};

std::unique_ptr<Memory> make_host_memory();
// Device memory of CUDA device 0 (cuda_memory.cu); throws when this build has no CUDA.
std::unique_ptr<Memory> make_cuda_memory();
std::unique_ptr<Memory> make_memory(DeviceType device);

// A deterministic generator (splitmix64), identical on every platform.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  uint64_t next();
  double uniform(double lo, double hi);

 private:
  uint64_t state_;
};

// A contiguous tensor owning its buffer. Values cross the host boundary as doubles, converted
// from and to the tensor's dtype (rounding to nearest even).
class Tensor {
 public:
  Tensor() = default;
  Tensor(Memory& memory, DType dtype, std::initializer_list<int64_t> dims);
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  ~Tensor();

  const TensorView& view() const { return view_; }
  int64_t numel() const { return view_.numel(); }
  // Elements [first, first + values.size()).
  void write(const std::vector<double>& values, int64_t first = 0);
  std::vector<double> read(int64_t first, int64_t count) const;
  std::vector<double> read() const { return read(0, numel()); }
  // Uniform values in [lo, hi), written in chunks (no full host copy of a large tensor).
  void fill_uniform(Random& random, double lo, double hi);

 private:
  Memory* memory_ = nullptr;
  TensorView view_;
};

// The shape of a layer's workload.
struct LayerShape {
  Geometry geometry;
  int64_t batch = 1;
  int64_t slots = 1;
  int64_t buffer_len = 16;  // L
};

// Slot id of padded rows in every workload.
constexpr int64_t kPadSlot = -1;

// The layer's parameters and one step's inputs. x, dt, B, C, z in the activation dtype; A, D,
// dt_bias in fp32; dt_softplus on (as in Mamba-2 models).
struct StepInputs {
  StepInputs(Memory& memory, const LayerShape& shape, DType act);
  Tensor x;                    // (batch, H, P)
  Tensor dt;                   // (batch, H) raw, before dt_bias and softplus
  Tensor B, C;                 // (batch, G, N)
  Tensor z;                    // (batch, H, P)
  Tensor A, D, dt_bias;        // (H)
  Tensor state_batch_indices;  // (batch) int32
};

// A layer's per-slot cache: the state (the checkpoint for ReplaySSM), the history, the cursors.
struct SlotCache {
  SlotCache(Memory& memory, const LayerShape& shape, DType state, DType act);
  Tensor state;     // (slots, H, P, N)
  Tensor x_cache;   // (slots, H, L, P) act
  Tensor B_cache;   // (slots, G, L, N) act
  Tensor dt_cache;  // (slots, H, L) fp32
  Tensor cursors;   // (slots) int32
  Tensor state_scale;    // (slots, H, P) fp32: 8-bit states only (zeros: a zero state)
  Tensor rounding_seed;  // (2) int32: the stochastic rounding key (zeros unless written)
  Tensor flush_counts;   // (slots) int32
};

// `out` is (batch, H, P) in the activation dtype of `inputs`.
Mamba2Step make_step(const StepInputs& inputs, const Tensor& out);
ReplayCache make_cache(const SlotCache& cache, bool stochastic_rounding = false);
Tensor make_out(Memory& memory, const LayerShape& shape, DType act);

// Host values of the parameters and of one step's activations, with the magnitudes of a trained
// Mamba-2 layer (A in [-8, -0.5], softplus(dt + dt_bias) around 0.05). Activations are rounded to
// `act`, so every consumer (in any dtype at least as wide) sees the same numbers.
struct ParameterValues {
  std::vector<double> A, D, dt_bias;  // (H) each
};
struct ActivationValues {
  std::vector<double> x, dt, B, C, z;  // shapes of StepInputs
};
ParameterValues random_parameters(const Geometry& geometry, Random& random);
ActivationValues random_activations(const LayerShape& shape, DType act, Random& random);
void write_parameters(StepInputs& inputs, const ParameterValues& values);
void write_activations(StepInputs& inputs, const ActivationValues& values);

// Random parameters and activations, rows mapped to slots 0..batch-1: a benchmark layer's inputs.
void fill_benchmark_inputs(StepInputs& inputs, const LayerShape& shape, DType act, Random& random);

// `values` rounded to `dtype` and back.
std::vector<double> round_to(std::vector<double> values, DType dtype);

}  // namespace replayssm::tool
