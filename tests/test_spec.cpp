// Speculative decoding: rollouts of ReplaySSM's verify / commit and of the baseline speculative
// path against the fp64 oracle on every backend, and proof that the rollout's checks have teeth.
#include <iostream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "replayssm/mamba2_spec.hpp"
#include "support/spec_rollout.hpp"

namespace replayssm::test {
namespace {

using DT = DType;

SpecRolloutConfig config(Geometry geometry, int64_t window, int64_t buffer_len, DType state, DType act,
                         Acceptance acceptance) {
  SpecRolloutConfig c;
  c.geometry = geometry;
  c.window = window;
  c.buffer_len = buffer_len;
  c.state_dtype = state;
  c.act_dtype = act;
  c.acceptance = acceptance;
  return c;
}

// Every window length's extremes, every acceptance model, every (state, activation) dtype pair
// once, the smallest buffer (L = 2T), a non power-of-two L, full and ragged windows, rows mapped to
// slots without state_batch_indices.
std::vector<SpecRolloutConfig> cases() {
  std::vector<SpecRolloutConfig> c;
  c.push_back(config(kSmall, 4, 16, DT::kFloat32, DT::kBFloat16, Acceptance::kMixed));
  c.back().recycles = 2;
  c.push_back(config(kOddGrouped, 2, 4, DT::kFloat32, DT::kFloat32, Acceptance::kAll));
  c.push_back(config(kOddWideState, 8, 16, DT::kBFloat16, DT::kFloat16, Acceptance::kBonusOnly));
  c.push_back(config(kOddGrouped, 3, 12, DT::kFloat16, DT::kBFloat16, Acceptance::kMixed));
  c.push_back(config(kSmall, 1, 2, DT::kFloat32, DT::kFloat16, Acceptance::kAll));
  c.push_back(config(kOddGrouped, 4, 16, DT::kFloat32, DT::kFloat32, Acceptance::kAll));
  c.back().ragged = false;
  c.push_back(config(kSmall, 8, 24, DT::kBFloat16, DT::kBFloat16, Acceptance::kMixed));
  c.back().pad_slot_id = 1000;
  c.push_back(config(kOddWideState, 5, 64, DT::kFloat16, DT::kFloat32, Acceptance::kMixed));
  c.push_back(config(kOddGrouped, 3, 8, DT::kFloat32, DT::kBFloat16, Acceptance::kMixed));
  c.back().identity_rows = true;
  return c;
}

// The real geometry the speculative bar is set on: Nemotron-H, T = 4, bf16 activations, fp32
// state (16-bit states are covered on the small shapes above).
std::vector<SpecRolloutConfig> nemotron_cases() {
  SpecRolloutConfig c = config(kNemotronH, 4, 16, DT::kFloat32, DT::kBFloat16, Acceptance::kMixed);
  c.requests = 2;
  c.foreign_slots = 1;
  c.steps = 60;
  return {c};
}

// The split path of the CUDA verify (a workspace): shapes whose layouts it takes (state_dim 64,
// 128 or 256, head_dim a multiple of 4), with short and long windows (the window kernel's two
// weight paths, its rounds of staged x), 1 to 8 tokens, every state dtype, groups split over window
// CTAs. The dot kernel folds the flush rows a part of the tile at a time (Nemotron Nano 4B: 80 rows
// in parts of 32, the last one short; with an fp32 state a head's rows in two chunks, 64 and 16; on
// the tensor cores where a 4- or 2-byte state with bf16 activations folds more than 16 tokens: L - T
// = 20 for fp32 and fp16, 38 for bf16), or leaves them to the flush kernel where the committed
// inputs take too much of the tile (fp32 activations, L = 64). A bf16 state with bf16 activations
// takes the other rows' dots on the tensor cores (N = 128, 64 and 256 with 2, 3 and 8 tokens). 81
// rows of 64 one-head groups are more window CTAs than an H200 holds at once (8- and 16-byte x packs):
// they take four head_dim rows a window thread, the smaller cases two (kSpecWindowRowsFew), with
// half a group's heads a window CTA (Nemotron-H 8 of 16, Nemotron Nano 4B 6 of 12).
std::vector<SpecRolloutConfig> split_cases() {
  std::vector<SpecRolloutConfig> c = nemotron_cases();
  c.push_back(config(kMamba2_2p7b, 8, 24, DT::kBFloat16, DT::kFloat16, Acceptance::kMixed));
  c.push_back(config(kNemotronNano4b, 3, 12, DT::kFloat16, DT::kFloat32, Acceptance::kBonusOnly));
  c.push_back(config(kNemotronNano4b, 4, 16, DT::kFloat32, DT::kBFloat16, Acceptance::kAll));
  c.push_back(config(kNemotronNano4b, 4, 24, DT::kFloat32, DT::kBFloat16, Acceptance::kMixed));
  c.push_back(config(kNemotronNano4b, 4, 24, DT::kFloat16, DT::kBFloat16, Acceptance::kMixed));
  c.push_back(config(kNemotronH, 2, 40, DT::kBFloat16, DT::kBFloat16, Acceptance::kAll));
  c.back().identity_rows = true;
  c.push_back(config(kMamba2_2p7b, 4, 64, DT::kFloat32, DT::kFloat32, Acceptance::kMixed));
  c.push_back(config(kVectorisedN64, 3, 16, DT::kBFloat16, DT::kBFloat16, Acceptance::kMixed));
  c.push_back(config(kVectorisedN256, 8, 16, DT::kBFloat16, DT::kBFloat16, Acceptance::kMixed));
  for (DT act : {DT::kBFloat16, DT::kFloat32}) {
    c.push_back(config(kOneHeadGroups, 4, 16, act == DT::kFloat32 ? DT::kFloat16 : DT::kFloat32, act,
                       Acceptance::kMixed));
    c.back().requests = 80;
    c.back().steps = 24;
  }
  for (SpecRolloutConfig& s : c) {
    s.backend = Backend::kCuda;
    s.workspace = true;
  }
  return c;
}

// A wide state's long buffer, whose verify CTAs need more than kSpecMaxSharedBytes (N = 256, L =
// 64: the window's widened B alone is 64 KiB), for an fp32 and a 16-bit state, on the fused kernel
// and on the split path: CUDA only.
std::vector<SpecRolloutConfig> long_buffer_cases() {
  std::vector<SpecRolloutConfig> c;
  for (DT state : {DT::kFloat32, DT::kBFloat16})
    for (bool workspace : {false, true}) {
      c.push_back(config(kVectorisedN256, 8, 64, state, DT::kBFloat16, Acceptance::kMixed));
      c.back().backend = Backend::kCuda;
      c.back().workspace = workspace;
    }
  return c;
}

std::vector<SpecRolloutConfig> on_backends(const std::vector<SpecRolloutConfig>& cases,
                                           std::vector<Backend> backends) {
  std::vector<SpecRolloutConfig> all;
  for (const SpecRolloutConfig& c : cases)
    for (Backend backend : backends) {
      all.push_back(c);
      all.back().backend = backend;
    }
  return all;
}

class SpecRolloutTest : public ::testing::TestWithParam<SpecRolloutConfig> {};

TEST_P(SpecRolloutTest, MatchesOracle) {
  const SpecRolloutConfig& c = GetParam();
  REPLAYSSM_SKIP_IF_UNAVAILABLE(c.backend);
  SpecRollout rollout(c);
  rollout.run();
  const Report& r = rollout.report();
  std::cout << r.summary() << "\n";
  EXPECT_TRUE(r.passed()) << r.summary();
  // The rollout did what it is for: verify steps that flushed and that did not, acceptance as
  // configured, recycled slots.
  EXPECT_EQ(r.steps, c.steps);
  EXPECT_GE(r.flush_rows, c.requests);
  EXPECT_GT(r.nonflush_rows, 0);
  EXPECT_EQ(r.recycled_slots, c.recycles);
  const AcceptanceCounts& a = rollout.acceptance();
  if (c.window > 1) {
    if (c.acceptance != Acceptance::kBonusOnly) {
      EXPECT_GT(a.all, 0);
    }
    if (c.acceptance != Acceptance::kAll) {
      EXPECT_GT(a.bonus_only, 0);
    }
    if (c.acceptance == Acceptance::kMixed && c.window > 2) {
      EXPECT_GT(a.partial, 0);
    }
  }
}

std::string test_name(const ::testing::TestParamInfo<SpecRolloutConfig>& info) {
  return info.param.name() + "_" + backend_name(info.param.backend);
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, SpecRolloutTest,
    ::testing::ValuesIn(on_backends(cases(), {Backend::kReference, Backend::kCpu, Backend::kCuda})),
    test_name);
// The fp64 reference backend would take most of a minute on this geometry: CPU and CUDA only.
INSTANTIATE_TEST_SUITE_P(NemotronH, SpecRolloutTest,
                         ::testing::ValuesIn(on_backends(nemotron_cases(), {Backend::kCpu, Backend::kCuda})),
                         test_name);
INSTANTIATE_TEST_SUITE_P(Split, SpecRolloutTest, ::testing::ValuesIn(split_cases()), test_name);
INSTANTIATE_TEST_SUITE_P(LongBuffer, SpecRolloutTest, ::testing::ValuesIn(long_buffer_cases()), test_name);

// The checks have teeth: a clean rollout starts failing, under the right check, as soon as one
// cached input, one checkpoint element or one ring entry is corrupted mid-run.
class SpecTeethTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override { REPLAYSSM_SKIP_IF_UNAVAILABLE(GetParam()); }

  SpecRolloutConfig config() const {
    SpecRolloutConfig c;
    c.backend = GetParam();
    c.geometry = kOddGrouped;
    c.window = 3;
    c.buffer_len = 16;
    c.steps = 20;
    c.recycles = 0;
    return c;
  }

  // Runs to a step where some request has committed inputs; returns its slot after checking that
  // the rollout is clean so far.
  static int64_t run_to_a_slot_with_history(SpecRollout& rollout) {
    for (int i = 0; i < 4 && !rollout.done(); ++i) rollout.step();
    while (rollout.slot_with_history() < 0 && !rollout.done()) rollout.step();
    EXPECT_TRUE(rollout.report().passed()) << rollout.report().summary();
    return rollout.slot_with_history();
  }
};

TEST_P(SpecTeethTest, AnUntouchedRolloutPasses) {
  SpecRollout rollout(config());
  rollout.run();
  EXPECT_TRUE(rollout.report().passed()) << rollout.report().summary();
}

TEST_P(SpecTeethTest, OneCorruptedCachedInputIsReported) {
  SpecRollout rollout(config());
  const int64_t slot = run_to_a_slot_with_history(rollout);
  ASSERT_GE(slot, 0);
  // x_cache[slot, head 1, last committed position, channel 2]: the committed input that the next
  // verify step weighs most (or folds into the checkpoint if the slot flushes).
  const SpecRolloutConfig& c = rollout.config();
  const int64_t P = c.geometry.head_dim, H = c.geometry.nheads;
  const int64_t R = spec_ring_len(c.buffer_len, c.window);
  const int64_t position = (rollout.expected_origin(slot) + rollout.expected_committed(slot) - 1) % R;
  const size_t offset = size_t(((slot * H + 1) * R + position) * P + 2) * sizeof(float);
  float value;
  rollout.x_cache().download(&value, offset, sizeof(value));
  value += 1.0f;
  rollout.x_cache().upload(&value, offset, sizeof(value));
  rollout.step();
  const Report& r = rollout.report();
  EXPECT_GT(r.failure_count(Check::kCache), 0) << r.summary();
  EXPECT_GT(r.failure_count(Check::kOutputError) + r.failure_count(Check::kFlushedCheckpoint), 0) << r.summary();
}

TEST_P(SpecTeethTest, ACorruptedCheckpointElementIsReported) {
  SpecRollout rollout(config());
  const int64_t slot = run_to_a_slot_with_history(rollout);
  ASSERT_GE(slot, 0);
  const Geometry& g = rollout.config().geometry;
  const size_t offset = size_t(slot * g.nheads * g.head_dim * g.state_dim) * sizeof(float);
  float value;
  rollout.checkpoint().download(&value, offset, sizeof(value));
  value += 1000.0f;  // state[slot, 0, 0, 0], decayed over the committed inputs before it is seen
  rollout.checkpoint().upload(&value, offset, sizeof(value));
  rollout.step();
  const Report& r = rollout.report();
  EXPECT_GT(r.failure_count(Check::kOutputError) + r.failure_count(Check::kFlushedCheckpoint), 0) << r.summary();
}

TEST_P(SpecTeethTest, AMovedRingIsReported) {
  SpecRollout rollout(config());
  const int64_t slot = run_to_a_slot_with_history(rollout);
  ASSERT_GE(slot, 0);
  int32_t committed;
  rollout.ring().download(&committed, size_t(2 * slot + 1) * sizeof(int32_t), sizeof(committed));
  --committed;  // forget the last committed input
  rollout.ring().upload(&committed, size_t(2 * slot + 1) * sizeof(int32_t), sizeof(committed));
  rollout.step();
  const Report& r = rollout.report();
  EXPECT_GT(r.failure_count(Check::kCursor), 0) << r.summary();
  EXPECT_GT(r.failure_count(Check::kCache) + r.failure_count(Check::kOutputError), 0) << r.summary();
}

INSTANTIATE_TEST_SUITE_P(Backends, SpecTeethTest,
                         ::testing::Values(Backend::kReference, Backend::kCpu, Backend::kCuda),
                         [](const auto& info) { return std::string(backend_name(info.param)); });

TEST(SpecRingLen, IsThePowerOfTwoThatHoldsTheBuffer) {
  EXPECT_EQ(spec_ring_len(2, 1), 2);
  EXPECT_EQ(spec_ring_len(8, 4), 8);
  EXPECT_EQ(spec_ring_len(12, 4), 16);
  EXPECT_EQ(spec_ring_len(16, 8), 16);
  EXPECT_EQ(spec_ring_len(17, 8), 32);
  EXPECT_EQ(spec_ring_len(64, 1), 64);
}

TEST(SpecFlushRule, FlushesWhenTheNextWindowMightNotFit) {
  // L = 16, T = 4: committed 8 leaves room for two more windows, 9 for one.
  EXPECT_FALSE(spec_flushes(8, 4, 16));
  EXPECT_TRUE(spec_flushes(9, 4, 16));
  EXPECT_FALSE(spec_flushes(0, 8, 16));
  EXPECT_TRUE(spec_flushes(1, 8, 16));
}

}  // namespace
}  // namespace replayssm::test
