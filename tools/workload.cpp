#include "workload.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <utility>

namespace replayssm::tool {
namespace {

class HostMemory : public Memory {
 public:
  Device device() const override { return Device{DeviceType::kCpu, 0}; }

  void* allocate(size_t bytes) override {
    constexpr size_t kAlignment = 64;  // a cache line
    const size_t rounded = std::max<size_t>((bytes + kAlignment - 1) / kAlignment * kAlignment, kAlignment);
    void* data = std::aligned_alloc(kAlignment, rounded);
    if (data == nullptr) throw std::bad_alloc();
    std::memset(data, 0, rounded);  // touch every page now, not inside a timed loop
    return data;
  }
  void release(void* data) noexcept override { std::free(data); }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
};

// Converts doubles to elements of `dtype` (dst: count elements) and back.
void encode(const double* src, DType dtype, void* dst, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const float f = float(src[i]);
    switch (dtype) {
      case DType::kFloat32: static_cast<float*>(dst)[i] = f; break;
      case DType::kFloat16: static_cast<uint16_t*>(dst)[i] = float_to_fp16(f); break;
      case DType::kBFloat16: static_cast<uint16_t*>(dst)[i] = float_to_bf16(f); break;
      case DType::kFloat64: static_cast<double*>(dst)[i] = src[i]; break;
      case DType::kInt32: static_cast<int32_t*>(dst)[i] = int32_t(src[i]); break;
      case DType::kInt8: static_cast<int8_t*>(dst)[i] = float_to_int8(f); break;
      case DType::kFloat8E4M3: static_cast<uint8_t*>(dst)[i] = float_to_e4m3(f); break;
    }
  }
}

void decode(const void* src, DType dtype, double* dst, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    switch (dtype) {
      case DType::kFloat32: dst[i] = static_cast<const float*>(src)[i]; break;
      case DType::kFloat16: dst[i] = fp16_to_float(static_cast<const uint16_t*>(src)[i]); break;
      case DType::kBFloat16: dst[i] = bf16_to_float(static_cast<const uint16_t*>(src)[i]); break;
      case DType::kFloat64: dst[i] = static_cast<const double*>(src)[i]; break;
      case DType::kInt32: dst[i] = static_cast<const int32_t*>(src)[i]; break;
      case DType::kInt8: dst[i] = static_cast<const int8_t*>(src)[i]; break;
      case DType::kFloat8E4M3: dst[i] = e4m3_to_float(static_cast<const uint8_t*>(src)[i]); break;
    }
  }
}

std::vector<double> uniform_values(Random& random, int64_t count, double lo, double hi) {
  std::vector<double> values(static_cast<size_t>(count));
  for (double& v : values) v = random.uniform(lo, hi);
  return values;
}

}  // namespace

std::unique_ptr<Memory> make_host_memory() { return std::make_unique<HostMemory>(); }

std::unique_ptr<Memory> make_memory(DeviceType device) {
  return device == DeviceType::kCuda ? make_cuda_memory() : make_host_memory();
}

#if !defined(REPLAYSSM_WITH_CUDA)
std::unique_ptr<Memory> make_cuda_memory() {
  throw std::runtime_error("device cuda is not available: this build of replayssm has no CUDA support");
}
#endif

uint64_t Random::next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Random::uniform(double lo, double hi) {
  const double unit = double(next() >> 11) * 0x1.0p-53;  // [0, 1)
  return lo + (hi - lo) * unit;
}

Tensor::Tensor(Memory& memory, DType dtype, std::initializer_list<int64_t> dims)
    : memory_(&memory) {
  view_ = TensorView::contiguous(nullptr, dtype, dims, memory.device());
  view_.data = memory.allocate(size_t(view_.numel() * dtype_size(dtype)));
}

Tensor::Tensor(Tensor&& other) noexcept
    : memory_(std::exchange(other.memory_, nullptr)), view_(std::exchange(other.view_, {})) {}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    if (view_.data) memory_->release(view_.data);
    memory_ = std::exchange(other.memory_, nullptr);
    view_ = std::exchange(other.view_, {});
  }
  return *this;
}

Tensor::~Tensor() {
  if (view_.data) memory_->release(view_.data);
}

void Tensor::write(const std::vector<double>& values, int64_t first) {
  const int64_t count = int64_t(values.size());
  if (first < 0 || first + count > numel()) throw std::out_of_range("Tensor::write past the end");
  const int64_t elem = dtype_size(view_.dtype);
  std::vector<unsigned char> bytes(size_t(count * elem));
  encode(values.data(), view_.dtype, bytes.data(), count);
  memory_->copy_from_host(static_cast<char*>(view_.data) + first * elem, bytes.data(), bytes.size());
}

std::vector<double> Tensor::read(int64_t first, int64_t count) const {
  if (first < 0 || count < 0 || first + count > numel())
    throw std::out_of_range("Tensor::read past the end");
  const int64_t elem = dtype_size(view_.dtype);
  std::vector<unsigned char> bytes(size_t(count * elem));
  memory_->copy_to_host(bytes.data(), static_cast<const char*>(view_.data) + first * elem, bytes.size());
  std::vector<double> values(static_cast<size_t>(count));
  decode(bytes.data(), view_.dtype, values.data(), count);
  return values;
}

void Tensor::fill_uniform(Random& random, double lo, double hi) {
  constexpr int64_t kChunk = int64_t(1) << 20;
  for (int64_t first = 0; first < numel(); first += kChunk)
    write(uniform_values(random, std::min(kChunk, numel() - first), lo, hi), first);
}

StepInputs::StepInputs(Memory& memory, const LayerShape& shape, DType act) {
  const Geometry& g = shape.geometry;
  const int64_t batch = shape.batch;
  x = Tensor(memory, act, {batch, g.heads, g.head_dim});
  dt = Tensor(memory, act, {batch, g.heads});
  B = Tensor(memory, act, {batch, g.groups, g.state_dim});
  C = Tensor(memory, act, {batch, g.groups, g.state_dim});
  z = Tensor(memory, act, {batch, g.heads, g.head_dim});
  A = Tensor(memory, DType::kFloat32, {g.heads});
  D = Tensor(memory, DType::kFloat32, {g.heads});
  dt_bias = Tensor(memory, DType::kFloat32, {g.heads});
  state_batch_indices = Tensor(memory, DType::kInt32, {batch});
}

SlotCache::SlotCache(Memory& memory, const LayerShape& shape, DType state_dtype, DType act) {
  const Geometry& g = shape.geometry;
  const int64_t slots = shape.slots, L = shape.buffer_len;
  state = Tensor(memory, state_dtype, {slots, g.heads, g.head_dim, g.state_dim});
  x_cache = Tensor(memory, act, {slots, g.heads, L, g.head_dim});
  B_cache = Tensor(memory, act, {slots, g.groups, L, g.state_dim});
  dt_cache = Tensor(memory, DType::kFloat32, {slots, g.heads, L});
  cursors = Tensor(memory, DType::kInt32, {slots});
  if (is_scaled_checkpoint(state_dtype)) state_scale = Tensor(memory, DType::kFloat32, {slots, g.heads, g.head_dim});
  rounding_seed = Tensor(memory, DType::kInt32, {2});
  flush_counts = Tensor(memory, DType::kInt32, {slots});
}

Mamba2Step make_step(const StepInputs& inputs, const Tensor& out) {
  Mamba2Step step;
  step.x = inputs.x.view();
  step.dt = inputs.dt.view();
  step.A = inputs.A.view();
  step.B = inputs.B.view();
  step.C = inputs.C.view();
  step.D = inputs.D.view();
  step.z = inputs.z.view();
  step.dt_bias = inputs.dt_bias.view();
  step.dt_softplus = true;
  step.state_batch_indices = inputs.state_batch_indices.view();
  step.pad_slot_id = kPadSlot;
  step.out = out.view();
  return step;
}

ReplayCache make_cache(const SlotCache& cache, bool stochastic_rounding) {
  ReplayCache c;
  c.state = cache.state.view();
  c.x_cache = cache.x_cache.view();
  c.B_cache = cache.B_cache.view();
  c.dt_cache = cache.dt_cache.view();
  c.cursors = cache.cursors.view();
  c.state_scale = cache.state_scale.view();
  c.stochastic_rounding = stochastic_rounding;
  if (stochastic_rounding) {
    c.rounding_seed = cache.rounding_seed.view();
    c.flush_counts = cache.flush_counts.view();
  }
  return c;
}

Tensor make_out(Memory& memory, const LayerShape& shape, DType act) {
  const Geometry& g = shape.geometry;
  return Tensor(memory, act, {shape.batch, g.heads, g.head_dim});
}

std::vector<double> round_to(std::vector<double> values, DType dtype) {
  std::vector<unsigned char> bytes(values.size() * size_t(dtype_size(dtype)));
  encode(values.data(), dtype, bytes.data(), int64_t(values.size()));
  decode(bytes.data(), dtype, values.data(), int64_t(values.size()));
  return values;
}

ParameterValues random_parameters(const Geometry& g, Random& random) {
  ParameterValues p;
  p.A = round_to(uniform_values(random, g.heads, -8.0, -0.5), DType::kFloat32);
  p.D = round_to(uniform_values(random, g.heads, 0.5, 1.5), DType::kFloat32);
  p.dt_bias = round_to(uniform_values(random, g.heads, -4.0, -2.0), DType::kFloat32);
  return p;
}

ActivationValues random_activations(const LayerShape& shape, DType act, Random& random) {
  const Geometry& g = shape.geometry;
  const int64_t batch = shape.batch;
  ActivationValues a;
  a.x = round_to(uniform_values(random, batch * g.heads * g.head_dim, -1.0, 1.0), act);
  a.dt = round_to(uniform_values(random, batch * g.heads, -1.0, 1.0), act);
  a.B = round_to(uniform_values(random, batch * g.groups * g.state_dim, -1.0, 1.0), act);
  a.C = round_to(uniform_values(random, batch * g.groups * g.state_dim, -1.0, 1.0), act);
  a.z = round_to(uniform_values(random, batch * g.heads * g.head_dim, -2.0, 2.0), act);
  return a;
}

void write_parameters(StepInputs& inputs, const ParameterValues& values) {
  inputs.A.write(values.A);
  inputs.D.write(values.D);
  inputs.dt_bias.write(values.dt_bias);
}

void write_activations(StepInputs& inputs, const ActivationValues& values) {
  inputs.x.write(values.x);
  inputs.dt.write(values.dt);
  inputs.B.write(values.B);
  inputs.C.write(values.C);
  inputs.z.write(values.z);
}

void fill_benchmark_inputs(StepInputs& inputs, const LayerShape& shape, DType act, Random& random) {
  write_parameters(inputs, random_parameters(shape.geometry, random));
  write_activations(inputs, random_activations(shape, act, random));
  std::vector<double> rows(size_t(shape.batch));
  for (int64_t r = 0; r < shape.batch; ++r) rows[size_t(r)] = double(r);
  inputs.state_batch_indices.write(rows);
}

}  // namespace replayssm::tool
