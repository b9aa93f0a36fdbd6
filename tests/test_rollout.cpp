// Multi-window rollouts of ReplaySSM and the baseline against the fp64 oracle, on every backend.
#include <iostream>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "support/rollout.hpp"

namespace replayssm::test {
namespace {

using DT = DType;
using Route = ReplayRoute;

RolloutConfig config(Geometry geometry, int64_t buffer_len, ReplayRoute route, DType state, DType act) {
  RolloutConfig c;
  c.geometry = geometry;
  c.buffer_len = buffer_len;
  c.route = route;
  c.state_dtype = state;
  c.act_dtype = act;
  return c;
}

// A focused matrix: every value of every axis appears, not the cross product.
std::vector<RolloutConfig> matrix_cases() {
  std::vector<RolloutConfig> cases;
  // Every (state, activation) dtype pair, each with another L and route.
  cases.push_back(config(kOddGrouped, 16, Route::kOutputOnly, DT::kFloat32, DT::kFloat32));
  cases.push_back(config(kOddWideState, 7, Route::kStateAndOutput, DT::kFloat32, DT::kFloat16));
  cases.push_back(config(kOddGrouped, 32, Route::kAuto, DT::kFloat32, DT::kBFloat16));
  cases.push_back(config(kOddWideState, 2, Route::kOutputOnly, DT::kFloat16, DT::kFloat32));
  cases.push_back(config(kOddGrouped, 16, Route::kStateAndOutput, DT::kFloat16, DT::kFloat16));
  cases.push_back(config(kSmall, 7, Route::kAuto, DT::kFloat16, DT::kBFloat16));
  cases.push_back(config(kOddGrouped, 1, Route::kOutputOnly, DT::kBFloat16, DT::kFloat32));
  cases.push_back(config(kOddWideState, 32, Route::kStateAndOutput, DT::kBFloat16, DT::kFloat16));
  cases.push_back(config(kSmall, 16, Route::kAuto, DT::kBFloat16, DT::kBFloat16));

  // Optional inputs: each one off, then all of them off.
  RolloutConfig c = config(kOddGrouped, 7, Route::kOutputOnly, DT::kFloat32, DT::kBFloat16);
  c.with_D = false;
  cases.push_back(c);
  c = config(kOddWideState, 16, Route::kStateAndOutput, DT::kFloat32, DT::kFloat16);
  c.with_z = false;
  cases.push_back(c);
  c = config(kOddGrouped, 2, Route::kAuto, DT::kBFloat16, DT::kBFloat16);
  c.with_dt_bias = false;
  cases.push_back(c);
  c = config(kSmall, 16, Route::kOutputOnly, DT::kFloat32, DT::kFloat32);
  c.dt_softplus = false;
  cases.push_back(c);
  c = config(kOddGrouped, 7, Route::kStateAndOutput, DT::kFloat16, DT::kFloat16);
  c.with_D = c.with_z = c.with_dt_bias = c.dt_softplus = false;
  cases.push_back(c);

  // Broadcast layouts, dt in fp32 under 16-bit activations, 16-bit parameters, packed xBC.
  c = config(kSmall, 16, Route::kOutputOnly, DT::kFloat32, DT::kBFloat16);
  c.dt_per_channel = true;
  cases.push_back(c);
  c = config(kOddGrouped, 7, Route::kStateAndOutput, DT::kFloat32, DT::kFloat16);
  c.A_per_element = true;
  cases.push_back(c);
  c = config(kOddWideState, 16, Route::kAuto, DT::kBFloat16, DT::kBFloat16);
  c.dt_per_channel = c.A_per_element = c.dt_float32 = true;
  c.param_dtype = DT::kBFloat16;
  cases.push_back(c);
  c = config(kSmall, 16, Route::kOutputOnly, DT::kFloat32, DT::kBFloat16);
  c.packed_xbc = true;
  cases.push_back(c);
  c = config(kOddGrouped, 7, Route::kStateAndOutput, DT::kFloat16, DT::kFloat16);
  c.packed_xbc = c.dt_float32 = true;
  c.param_dtype = DT::kFloat16;
  cases.push_back(c);

  // state_batch_indices absent (after a padded prelude that desynchronises the rows), with
  // batch == slots and with slots beyond the batch; a pad id other than -1.
  c = config(kOddGrouped, 7, Route::kOutputOnly, DT::kFloat32, DT::kFloat32);
  c.mapping = SlotMapping::kIdentity;
  c.foreign_slots = 0;
  cases.push_back(c);
  c = config(kOddWideState, 16, Route::kStateAndOutput, DT::kFloat16, DT::kBFloat16);
  c.mapping = SlotMapping::kIdentity;
  cases.push_back(c);
  c = config(kOddGrouped, 16, Route::kAuto, DT::kFloat32, DT::kFloat16);
  c.pad_slot_id = 1000;
  cases.push_back(c);

  // The largest buffer.
  cases.push_back(config(kOddGrouped, 64, Route::kAuto, DT::kFloat32, DT::kBFloat16));

  // The vectorised layouts' other state dims, L from 1 to 64 (a 16-bit N = 256 state at L = 33: the
  // split path's flush kernel within bytes of 48 KiB of shared memory).
  for (auto [geometry, L, route, state, act] :
       {std::tuple{kVectorisedN64, 1, Route::kOutputOnly, DT::kFloat32, DT::kFloat32},
        std::tuple{kVectorisedN64, 7, Route::kAuto, DT::kBFloat16, DT::kFloat16},
        std::tuple{kVectorisedN64, 64, Route::kOutputOnly, DT::kFloat16, DT::kBFloat16},
        std::tuple{kVectorisedN64, 16, Route::kOutputOnly, DT::kBFloat16, DT::kBFloat16},
        std::tuple{kVectorisedN256, 16, Route::kAuto, DT::kFloat32, DT::kBFloat16},
        std::tuple{kVectorisedN256, 2, Route::kOutputOnly, DT::kBFloat16, DT::kBFloat16},
        std::tuple{kVectorisedN256, 64, Route::kAuto, DT::kFloat32, DT::kFloat32},
        std::tuple{kVectorisedN256, 33, Route::kOutputOnly, DT::kFloat16, DT::kFloat32}})
    cases.push_back(config(geometry, L, route, state, act));

  // The real geometries, with few rows: one state slot is 1M elements.
  for (auto [geometry, L, route, state, act] :
       {std::tuple{kNemotronH, 16, Route::kOutputOnly, DT::kFloat32, DT::kBFloat16},
        std::tuple{kMamba2_2p7b, 7, Route::kStateAndOutput, DT::kBFloat16, DT::kBFloat16},
        std::tuple{kNemotronNano4b, 7, Route::kAuto, DT::kFloat32, DT::kFloat16},
        std::tuple{kNemotronNano4b, 24, Route::kOutputOnly, DT::kFloat32, DT::kBFloat16}}) {
    c = config(geometry, L, route, state, act);
    c.requests = 2;
    c.foreign_slots = 1;
    cases.push_back(c);
  }
  return cases;
}

// The 1e-5 promise over >= 100 steps: fp32 state, each activation dtype.
std::vector<RolloutConfig> long_cases() {
  std::vector<RolloutConfig> cases;
  for (auto [route, act] : {std::pair{Route::kOutputOnly, DT::kFloat32},
                            std::pair{Route::kStateAndOutput, DT::kFloat16},
                            std::pair{Route::kAuto, DT::kBFloat16}}) {
    RolloutConfig c = config(kSmall, 16, route, DT::kFloat32, act);
    c.steps = 120;
    cases.push_back(c);
  }
  return cases;
}

// Slots handed to new requests several times mid-run.
std::vector<RolloutConfig> recycling_cases() {
  RolloutConfig shuffled = config(kOddGrouped, 7, Route::kOutputOnly, DT::kFloat32, DT::kBFloat16);
  shuffled.recycles = 3;
  RolloutConfig identity = config(kSmall, 16, Route::kStateAndOutput, DT::kBFloat16, DT::kFloat16);
  identity.recycles = 3;
  identity.mapping = SlotMapping::kIdentity;
  return {shuffled, identity};
}

// 8-bit checkpoints and stochastic rounding at flush: every format with each route, partial
// register tiles (N = 33), recycled slots, a long run and the real geometries.
std::vector<RolloutConfig> low_precision_cases() {
  std::vector<RolloutConfig> cases;
  cases.push_back(config(kOddGrouped, 16, Route::kOutputOnly, DT::kInt8, DT::kFloat32));
  cases.push_back(config(kSmall, 7, Route::kStateAndOutput, DT::kInt8, DT::kBFloat16));
  cases.push_back(config(kOddWideState, 2, Route::kAuto, DT::kInt8, DT::kFloat16));
  cases.push_back(config(kOddGrouped, 7, Route::kStateAndOutput, DT::kFloat8E4M3, DT::kBFloat16));
  cases.push_back(config(kSmall, 16, Route::kOutputOnly, DT::kFloat8E4M3, DT::kFloat16));
  cases.push_back(config(kOddWideState, 32, Route::kAuto, DT::kFloat8E4M3, DT::kFloat32));
  for (auto [geometry, L, route, state, act] :
       {std::tuple{kOddGrouped, 16, Route::kOutputOnly, DT::kFloat16, DT::kBFloat16},
        std::tuple{kSmall, 7, Route::kStateAndOutput, DT::kBFloat16, DT::kBFloat16},
        std::tuple{kOddWideState, 7, Route::kAuto, DT::kInt8, DT::kFloat16},
        std::tuple{kSmall, 16, Route::kOutputOnly, DT::kFloat8E4M3, DT::kBFloat16}}) {
    RolloutConfig c = config(geometry, L, route, state, act);
    c.stochastic_rounding = true;
    cases.push_back(c);
  }
  RolloutConfig c = config(kSmall, 16, Route::kAuto, DT::kInt8, DT::kBFloat16);
  c.recycles = 3;
  c.mapping = SlotMapping::kIdentity;
  cases.push_back(c);
  c = config(kOddGrouped, 7, Route::kOutputOnly, DT::kBFloat16, DT::kFloat16);
  c.recycles = 3;
  c.stochastic_rounding = true;
  cases.push_back(c);
  c = config(kSmall, 16, Route::kAuto, DT::kFloat8E4M3, DT::kBFloat16);
  c.steps = 120;
  c.stochastic_rounding = true;
  cases.push_back(c);
  for (auto [geometry, L, route, state, sr] :
       {std::tuple{kNemotronH, 16, Route::kOutputOnly, DT::kInt8, false},
        std::tuple{kMamba2_2p7b, 7, Route::kStateAndOutput, DT::kFloat8E4M3, true},
        std::tuple{kNemotronNano4b, 7, Route::kAuto, DT::kFloat16, true}}) {
    c = config(geometry, L, route, state, DT::kBFloat16);
    c.stochastic_rounding = sr;
    c.requests = 2;
    c.foreign_slots = 1;
    cases.push_back(c);
  }
  return cases;
}

// Each case on the reference, CPU and CUDA backends, and on CUDA with a workspace (the split path).
std::vector<RolloutConfig> on_every_backend(const std::vector<RolloutConfig>& cases) {
  std::vector<RolloutConfig> all;
  for (const RolloutConfig& c : cases) {
    for (Backend backend : {Backend::kReference, Backend::kCpu, Backend::kCuda}) {
      all.push_back(c);
      all.back().backend = backend;
    }
    all.push_back(c);
    all.back().backend = Backend::kCuda;
    all.back().workspace = true;
  }
  return all;
}

// Enough Nemotron-H rows that the split path's dot kernel folds a 16-bit state's flush rows itself
// (dot_flush_part_rows_for: from 24 dot CTAs an SM; 57 rows make 27 on an H200), for both 16-bit
// formats, on the CUDA cores (L = 16) and on the tensor cores (L = 32), and the single kernel (no
// workspace) over as many rows: CUDA only.
std::vector<RolloutConfig> wide_batch_cases() {
  std::vector<RolloutConfig> cases;
  for (auto [state, workspace, L] :
       {std::tuple{DT::kBFloat16, true, 16}, std::tuple{DT::kFloat16, true, 16}, std::tuple{DT::kBFloat16, false, 16},
        std::tuple{DT::kBFloat16, true, 32}, std::tuple{DT::kFloat16, true, 32}}) {
    RolloutConfig c = config(kNemotronH, L, Route::kOutputOnly, state, DT::kBFloat16);
    c.backend = Backend::kCuda;
    c.workspace = workspace;
    c.requests = 56;
    c.steps = 40 * L / 16;  // every row flushes at least once
    c.recycles = 0;
    cases.push_back(c);
  }
  return cases;
}

// Enough rows that a call without a workspace takes the dot kernel with the window
// (one_kernel_is_dot_kernel: from one of its CTAs an SM, a CTA a head; 24 rows of 8 heads or 4 of
// 64 or 80 make 192 to 320 CTAs, more than the 132 SMs of an H100 or H200 and fewer than 8 an SM),
// over both state dims it takes, L from 1 to 64 (the tensor-core fold past 16 tokens), every dtype
// it takes, and heads of 64 x 128 whose flush rows fold the tile whole (16-bit, L = 40) or in two
// parts (16-bit and fp32, L = 64: five CTAs an SM) beside their window (one_kernel_smem): CUDA only.
std::vector<RolloutConfig> dot_window_cases() {
  std::vector<RolloutConfig> cases;
  for (auto [geometry, L, route, state, act] :
       {std::tuple{kVectorisedN64, 1, Route::kOutputOnly, DT::kFloat32, DT::kFloat32},
        std::tuple{kVectorisedN64, 7, Route::kAuto, DT::kBFloat16, DT::kFloat16},
        std::tuple{kVectorisedN64, 64, Route::kOutputOnly, DT::kFloat16, DT::kBFloat16},
        std::tuple{kOneHeadGroups, 16, Route::kOutputOnly, DT::kBFloat16, DT::kBFloat16},
        std::tuple{kOneHeadGroups, 33, Route::kAuto, DT::kFloat32, DT::kBFloat16},
        std::tuple{kOneHeadGroups, 2, Route::kOutputOnly, DT::kFloat16, DT::kFloat32},
        std::tuple{kMamba2_2p7b, 40, Route::kOutputOnly, DT::kBFloat16, DT::kBFloat16},
        std::tuple{kMamba2_2p7b, 64, Route::kAuto, DT::kFloat16, DT::kBFloat16},
        std::tuple{kMamba2_2p7b, 64, Route::kOutputOnly, DT::kFloat32, DT::kBFloat16}}) {
    RolloutConfig c = config(geometry, L, route, state, act);
    c.backend = Backend::kCuda;
    c.requests = geometry.nheads < 64 ? 24 : 4;
    cases.push_back(c);
  }
  return cases;
}

// The split path where its flush kernel's window takes more than the default 48 KiB of shared
// memory (flush_smem_limit): an fp32 and a 16-bit state of N = 128 past L = 46 and 58, a 16-bit
// one of N = 256 past L = 32; each call must take it (its workspace written): CUDA only.
std::vector<RolloutConfig> long_buffer_split_cases() {
  std::vector<RolloutConfig> cases;
  for (auto [geometry, L, state, act] :
       {std::tuple{kOneHeadGroups, 64, DT::kFloat32, DT::kBFloat16},
        std::tuple{kOneHeadGroups, 59, DT::kBFloat16, DT::kFloat16},
        std::tuple{kVectorisedN256, 40, DT::kBFloat16, DT::kBFloat16}}) {
    RolloutConfig c = config(geometry, L, Route::kOutputOnly, state, act);
    c.backend = Backend::kCuda;
    c.workspace = c.expect_split_path = true;
    cases.push_back(c);
  }
  return cases;
}

class RolloutTest : public ::testing::TestWithParam<RolloutConfig> {};

TEST_P(RolloutTest, MatchesOracle) {
  const RolloutConfig& c = GetParam();
  REPLAYSSM_SKIP_IF_UNAVAILABLE(c.backend);
  Rollout rollout(c);
  rollout.run();
  const Report& r = rollout.report();
  std::cout << r.summary() << "\n";
  EXPECT_TRUE(r.passed()) << r.summary();
  // The rollout did what it is for: it crossed flushes, buffered tokens and recycled slots.
  EXPECT_GE(r.flush_rows, c.requests);
  if (c.buffer_len > 1) {
    EXPECT_GT(r.nonflush_rows, r.flush_rows);
  }
  EXPECT_EQ(r.recycled_slots, c.recycles);
}

std::string test_name(const ::testing::TestParamInfo<RolloutConfig>& info) {
  return info.param.name() + "_" + backend_name(info.param.backend);
}

INSTANTIATE_TEST_SUITE_P(Matrix, RolloutTest, ::testing::ValuesIn(on_every_backend(matrix_cases())), test_name);
INSTANTIATE_TEST_SUITE_P(Long, RolloutTest, ::testing::ValuesIn(on_every_backend(long_cases())), test_name);
INSTANTIATE_TEST_SUITE_P(LowPrecision, RolloutTest, ::testing::ValuesIn(on_every_backend(low_precision_cases())),
                         test_name);
INSTANTIATE_TEST_SUITE_P(RecycledSlots, RolloutTest, ::testing::ValuesIn(on_every_backend(recycling_cases())),
                         test_name);
INSTANTIATE_TEST_SUITE_P(WideBatch, RolloutTest, ::testing::ValuesIn(wide_batch_cases()), test_name);
INSTANTIATE_TEST_SUITE_P(DotWindow, RolloutTest, ::testing::ValuesIn(dot_window_cases()), test_name);
INSTANTIATE_TEST_SUITE_P(LongBufferSplit, RolloutTest, ::testing::ValuesIn(long_buffer_split_cases()), test_name);

}  // namespace
}  // namespace replayssm::test
