// The rollout checks have teeth: a rollout that passes starts failing, under the right check, as
// soon as one cached value, one checkpoint element or one cursor is corrupted mid-run, or when a
// call expected on the split path falls back.
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "support/rollout.hpp"

namespace replayssm::test {
namespace {

class HarnessTeethTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override { REPLAYSSM_SKIP_IF_UNAVAILABLE(GetParam()); }

  RolloutConfig config() const {
    RolloutConfig c;
    c.backend = GetParam();
    c.geometry = kOddGrouped;
    c.buffer_len = 7;
    c.route = ReplayRoute::kOutputOnly;
    c.act_dtype = DType::kBFloat16;
    return c;
  }

  // Runs past the first window, to a step where some request has tokens in its buffer; returns
  // that request's slot after checking that the rollout is clean so far.
  static int64_t run_to_a_slot_with_history(Rollout& rollout) {
    const int64_t L = rollout.config().buffer_len;
    for (int64_t i = 0; i < 2 * L && !rollout.done(); ++i) rollout.step();
    while (rollout.slot_with_history() < 0 && !rollout.done()) rollout.step();
    EXPECT_TRUE(rollout.report().passed()) << rollout.report().summary();
    return rollout.slot_with_history();
  }
};

TEST_P(HarnessTeethTest, AnUntouchedRolloutPasses) {
  Rollout rollout(config());
  rollout.run();
  EXPECT_TRUE(rollout.report().passed()) << rollout.report().summary();
}

TEST_P(HarnessTeethTest, OneFlippedBitInTheCacheIsReported) {
  Rollout rollout(config());
  const int64_t slot = run_to_a_slot_with_history(rollout);
  ASSERT_GE(slot, 0);
  // x_cache[slot, head 1, position 0, channel 2]: a token the next step replays.
  const RolloutConfig& c = rollout.config();
  const int64_t P = c.geometry.head_dim, H = c.geometry.nheads, L = c.buffer_len;
  const size_t offset = size_t(((slot * H + 1) * L + 0) * P + 2) * sizeof(uint16_t);
  uint16_t value;
  rollout.x_cache().download(&value, offset, sizeof(value));
  value ^= 1;  // the lowest mantissa bit
  rollout.x_cache().upload(&value, offset, sizeof(value));
  rollout.step();
  EXPECT_GT(rollout.report().failure_count(Check::kCache), 0) << rollout.report().summary();
}

TEST_P(HarnessTeethTest, ACorruptedCheckpointElementIsReported) {
  Rollout rollout(config());
  const int64_t slot = run_to_a_slot_with_history(rollout);
  ASSERT_GE(slot, 0);
  const RolloutConfig& c = rollout.config();
  const size_t offset = size_t(slot * c.geometry.nheads * c.geometry.head_dim * c.geometry.state_dim) * sizeof(float);
  float value;
  rollout.checkpoint().download(&value, offset, sizeof(value));
  value += 1.0f;  // state[slot, 0, 0, 0]
  rollout.checkpoint().upload(&value, offset, sizeof(value));
  rollout.step();
  EXPECT_GT(rollout.report().failure_count(Check::kOutputError), 0) << rollout.report().summary();
}

TEST_P(HarnessTeethTest, AMovedCursorIsReported) {
  Rollout rollout(config());
  const int64_t slot = run_to_a_slot_with_history(rollout);
  ASSERT_GE(slot, 0);
  int32_t cursor = rollout.expected_cursors()[slot] - 1;  // forget the last buffered token
  rollout.cursors().upload(&cursor, size_t(slot) * sizeof(int32_t), sizeof(cursor));
  rollout.step();
  EXPECT_GT(rollout.report().failure_count(Check::kCursor), 0) << rollout.report().summary();
  EXPECT_GT(rollout.report().failure_count(Check::kCache), 0) << rollout.report().summary();
}

// A call that falls back from the split path to the single kernel (here: the state-and-output
// route, which the split path does not take) is reported where the split path was expected.
TEST(HarnessTeeth, ACallOffTheSplitPathIsReported) {
  REPLAYSSM_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  RolloutConfig c;
  c.backend = Backend::kCuda;
  c.geometry = kVectorisedN64;
  c.buffer_len = 7;
  c.route = ReplayRoute::kStateAndOutput;
  c.act_dtype = DType::kBFloat16;
  c.workspace = c.expect_split_path = true;
  Rollout rollout(c);
  rollout.run();
  EXPECT_EQ(rollout.report().failure_count(Check::kSplitPathNotTaken), 1) << rollout.report().summary();
  c.route = ReplayRoute::kOutputOnly;
  Rollout on_the_split_path(c);
  on_the_split_path.run();
  EXPECT_TRUE(on_the_split_path.report().passed()) << on_the_split_path.report().summary();
}

INSTANTIATE_TEST_SUITE_P(Backends, HarnessTeethTest,
                         ::testing::Values(Backend::kReference, Backend::kCpu, Backend::kCuda),
                         [](const auto& info) { return std::string(backend_name(info.param)); });

}  // namespace
}  // namespace replayssm::test
