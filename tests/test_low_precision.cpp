// Low-precision checkpoints across backends: one flush of inputs whose fp32 arithmetic is exact
// (A = 0, dt = 1, dyadic x and B), so every backend reaches the same fp32 state and must then
// store the same checkpoint bits; and those bits are the documented rules of common/rounding.hpp
// applied to the exact state (key: seed, slot, element index, flush count).
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <tuple>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/rounding.hpp"
#include "replayssm/mamba2.hpp"
#include "support/buffer.hpp"
#include "support/host_tensor.hpp"

namespace replayssm::test {
namespace {

constexpr int64_t H = 4, P = 5, N = 33, G = 2, L = 4, kSlots = 3, kBatch = 2;
constexpr int32_t kRowSlots[kBatch] = {2, 0};  // both at cursor L - 1: both flush
constexpr int32_t kSeed[2] = {-123456789, 42};
constexpr int32_t kFlushCounts[kSlots] = {7, 1000, 3};

// The call's host inputs, exact in fp32 arithmetic: the state after the flush is
// S0 + sum over the L tokens of x_j B_j^T, with x, B multiples of 1/64 and S0 on the checkpoint's
// grid, so its bits lie below the checkpoint's precision and the rounding has work to do.
struct ExactFlush {
  DType state_dtype;
  HostTensor state, scale;                // (slots, H, P, N), (slots, H, P)
  HostTensor x_cache, B_cache, dt_cache;  // (slots, H, L, P), (slots, G, L, N), (slots, H, L)
  HostTensor x, B, C, dt, A;              // (batch, H, P), (batch, G, N) x2, (batch, H), (H)
  std::vector<double> exact_state;        // (slots, H, P, N)

  explicit ExactFlush(DType dtype)
      : state_dtype(dtype),
        state(dtype, {kSlots, H, P, N}),
        scale(DType::kFloat32, {kSlots, H, P}),
        x_cache(DType::kFloat32, {kSlots, H, L, P}),
        B_cache(DType::kFloat32, {kSlots, G, L, N}),
        dt_cache(DType::kFloat32, {kSlots, H, L}),
        x(DType::kFloat32, {kBatch, H, P}),
        B(DType::kFloat32, {kBatch, G, N}),
        C(DType::kFloat32, {kBatch, G, N}),
        dt(DType::kFloat32, {kBatch, H}),
        A(DType::kFloat32, {H}) {
    std::mt19937_64 rng(uint64_t(dtype) + 1);
    std::uniform_int_distribution<int> small(-64, 64), stored(-100, 100);
    auto dyadic = [&] { return small(rng) / 64.0; };
    const bool scaled = is_scaled_checkpoint(dtype);
    for (int64_t i = 0; i < state.numel(); ++i) state.set(i, scaled ? stored(rng) : 1 + stored(rng) / 128.0);
    for (int64_t i = 0; i < scale.numel(); ++i) scale.set(i, 0.25);  // a power of two: exact
    for (HostTensor* t : {&x_cache, &B_cache, &x, &B, &C})
      for (int64_t i = 0; i < t->numel(); ++i) t->set(i, dyadic());
    for (HostTensor* t : {&dt_cache, &dt})
      for (int64_t i = 0; i < t->numel(); ++i) t->set(i, 1.0);
    for (int64_t h = 0; h < H; ++h) A.set(h, 0.0);

    exact_state.resize(size_t(state.numel()));
    for (int64_t i = 0; i < state.numel(); ++i)
      exact_state[i] = scaled ? scale.get(i / N) * state.get(i) : state.get(i);
    for (int64_t row = 0; row < kBatch; ++row) {
      const int64_t slot = kRowSlots[row];
      for (int64_t h = 0; h < H; ++h)
        for (int64_t p = 0; p < P; ++p)
          for (int64_t n = 0; n < N; ++n) {
            double& s = exact_state[((slot * H + h) * P + p) * N + n];
            const int64_t g = h / (H / G);
            for (int64_t j = 0; j < L - 1; ++j)
              s += x_cache.get(((slot * H + h) * L + j) * P + p) * B_cache.get(((slot * G + g) * L + j) * N + n);
            s += x.get((row * H + h) * P + p) * B.get((row * G + g) * N + n);
          }
    }
  }
};

struct FlushResult {
  std::vector<uint8_t> state, scale, flush_counts;
};

// One replay_decode of `f` on `backend`; every slot's cursor is L - 1.
FlushResult run_flush(const ExactFlush& f, Backend backend, bool stochastic) {
  const Device device = device_for(backend);
  const bool scaled = is_scaled_checkpoint(f.state_dtype);
  Buffer state = upload_copy(device, f.state), scale = upload_copy(device, f.scale);
  Buffer x_cache = upload_copy(device, f.x_cache), B_cache = upload_copy(device, f.B_cache);
  Buffer dt_cache = upload_copy(device, f.dt_cache);
  Buffer x = upload_copy(device, f.x), B = upload_copy(device, f.B), C = upload_copy(device, f.C);
  Buffer dt = upload_copy(device, f.dt), A = upload_copy(device, f.A);
  Buffer out(device, size_t(kBatch * H * P * 4));
  const std::vector<int32_t> cursor_values(kSlots, int32_t(L - 1));
  Buffer cursors(device, sizeof(int32_t) * kSlots), indices(device, sizeof(kRowSlots));
  Buffer seed(device, sizeof(kSeed)), flush_counts(device, sizeof(kFlushCounts));
  cursors.upload(cursor_values.data(), 0, cursors.bytes());
  indices.upload(kRowSlots, 0, sizeof(kRowSlots));
  seed.upload(kSeed, 0, sizeof(kSeed));
  flush_counts.upload(kFlushCounts, 0, sizeof(kFlushCounts));

  ReplayCache cache;
  cache.state = state.view(f.state_dtype, {kSlots, H, P, N});
  cache.x_cache = x_cache.view(DType::kFloat32, {kSlots, H, L, P});
  cache.B_cache = B_cache.view(DType::kFloat32, {kSlots, G, L, N});
  cache.dt_cache = dt_cache.view(DType::kFloat32, {kSlots, H, L});
  cache.cursors = cursors.view(DType::kInt32, {kSlots});
  if (scaled) cache.state_scale = scale.view(DType::kFloat32, {kSlots, H, P});
  cache.stochastic_rounding = stochastic;
  cache.rounding_seed = seed.view(DType::kInt32, {2});
  cache.flush_counts = flush_counts.view(DType::kInt32, {kSlots});
  Mamba2Step step;
  step.x = x.view(DType::kFloat32, {kBatch, H, P});
  step.B = B.view(DType::kFloat32, {kBatch, G, N});
  step.C = C.view(DType::kFloat32, {kBatch, G, N});
  step.dt = dt.view(DType::kFloat32, {kBatch, H});
  step.A = A.view(DType::kFloat32, {H});
  step.state_batch_indices = indices.view(DType::kInt32, {kBatch});
  step.out = out.view(DType::kFloat32, {kBatch, H, P});
  replay_decode(cache, step, ReplayRoute::kAuto, ExecOptions{backend});
  return FlushResult{state.download(), scaled ? scale.download() : std::vector<uint8_t>{}, flush_counts.download()};
}

// The checkpoint that the rules of common/rounding.hpp give for the exact state.
template <typename S> FlushResult expected_flush(const ExactFlush& f, bool stochastic) {
  std::vector<S> stored(size_t(f.state.numel()));
  std::memcpy(stored.data(), f.state.data(), f.state.bytes().size());
  std::vector<float> scales(size_t(f.scale.numel()));
  std::memcpy(scales.data(), f.scale.data(), f.scale.bytes().size());
  std::vector<int32_t> counts(kFlushCounts, kFlushCounts + kSlots);
  std::vector<float> row(N);
  for (int32_t slot : kRowSlots) {
    FlushRandomBits bits{uint32_t(kSeed[0]), uint32_t(kSeed[1]), uint32_t(slot), uint32_t(kFlushCounts[slot])};
    for (int64_t hp = 0; hp < H * P; ++hp) {
      const int64_t r = slot * H * P + hp;
      for (int64_t n = 0; n < N; ++n) row[n] = float(f.exact_state[r * N + n]);
      round_checkpoint_row(row.data(), N, stored.data() + r * N, scales.data() + r, stochastic, bits,
                           uint32_t(hp * N));
    }
    if (stochastic) ++counts[slot];
  }
  auto bytes = [](const auto& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    return std::vector<uint8_t>(p, p + v.size() * sizeof(v[0]));
  };
  return FlushResult{bytes(stored), is_scaled_checkpoint(f.state_dtype) ? bytes(scales) : std::vector<uint8_t>{},
                     bytes(counts)};
}

FlushResult expected_flush(const ExactFlush& f, bool stochastic) {
  switch (f.state_dtype) {
    case DType::kFloat16: return expected_flush<Half>(f, stochastic);
    case DType::kBFloat16: return expected_flush<BFloat16>(f, stochastic);
    case DType::kInt8: return expected_flush<Int8>(f, stochastic);
    default: return expected_flush<Float8E4M3>(f, stochastic);
  }
}

struct FlushCase {
  DType state_dtype;
  bool stochastic;
};

class ExactFlushTest : public ::testing::TestWithParam<std::tuple<FlushCase, Backend>> {};

TEST_P(ExactFlushTest, StoresTheRoundingRulesOfTheExactState) {
  const auto [c, backend] = GetParam();
  REPLAYSSM_SKIP_IF_UNAVAILABLE(backend);
  const ExactFlush f(c.state_dtype);
  const FlushResult expected = expected_flush(f, c.stochastic);
  const FlushResult actual = run_flush(f, backend, c.stochastic);
  EXPECT_TRUE(actual.state == expected.state) << "checkpoint bits differ";
  EXPECT_TRUE(actual.scale == expected.scale) << "scales differ";
  EXPECT_TRUE(actual.flush_counts == expected.flush_counts) << "flush counts differ";
  // The rounding changed the state (the exact values are off the grid), and the unused slot 1
  // kept its bytes.
  EXPECT_FALSE(actual.state == f.state.bytes());
  const int64_t slot_bytes = H * P * N * dtype_size(c.state_dtype);
  EXPECT_TRUE(std::equal(actual.state.begin() + slot_bytes, actual.state.begin() + 2 * slot_bytes,
                         f.state.bytes().begin() + slot_bytes));
  if (c.stochastic) {
    // Stochastic rounding differs from rounding to nearest somewhere.
    const FlushResult nearest = run_flush(f, backend, false);
    EXPECT_FALSE(nearest.state == actual.state) << "stochastic rounding changed nothing";
  }
}

std::string flush_case_name(const ::testing::TestParamInfo<std::tuple<FlushCase, Backend>>& info) {
  const auto [c, backend] = info.param;
  return std::string(short_dtype_name(c.state_dtype)) + (c.stochastic ? "_sr_" : "_nearest_") + backend_name(backend);
}

INSTANTIATE_TEST_SUITE_P(
    EveryBackend, ExactFlushTest,
    ::testing::Combine(::testing::Values(FlushCase{DType::kFloat16, true}, FlushCase{DType::kBFloat16, true},
                                         FlushCase{DType::kInt8, false}, FlushCase{DType::kInt8, true},
                                         FlushCase{DType::kFloat8E4M3, false}, FlushCase{DType::kFloat8E4M3, true}),
                       ::testing::Values(Backend::kReference, Backend::kCpu, Backend::kCuda)),
    flush_case_name);

}  // namespace
}  // namespace replayssm::test
