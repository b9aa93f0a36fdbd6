// replay_advance and replay_reset: wrap at L, pad rows skipped, absent indices advance every slot.
#include <cstdint>
#include <deque>
#include <vector>

#include <gtest/gtest.h>

#include "support/buffer.hpp"

namespace replayssm::test {
namespace {

class CursorTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override { REPLAYSSM_SKIP_IF_UNAVAILABLE(GetParam()); }

  // A 1-D int32 tensor on the backend's device.
  Buffer& ints(const std::vector<int32_t>& values) {
    buffers_.emplace_back(device_for(GetParam()), values.size() * sizeof(int32_t));
    buffers_.back().upload(values.data(), 0, buffers_.back().bytes());
    return buffers_.back();
  }
  static TensorView view(const Buffer& b) {
    return b.view(DType::kInt32, {int64_t(b.bytes() / sizeof(int32_t))});
  }
  static std::vector<int32_t> read(const Buffer& b) {
    std::vector<int32_t> values(b.bytes() / sizeof(int32_t));
    b.download(values.data(), 0, b.bytes());
    return values;
  }
  void advance(const Buffer& cursors, int64_t L, const Buffer* indices, int64_t pad = -1) {
    replay_advance(view(cursors), L, indices ? view(*indices) : TensorView{}, pad,
                   ExecOptions{GetParam()});
  }
  void reset(const Buffer& cursors, const Buffer& slots, int64_t pad = -1) {
    replay_reset(view(cursors), view(slots), pad, ExecOptions{GetParam()});
  }

 private:
  std::deque<Buffer> buffers_;  // a deque: growing it keeps the references handed out valid
};

TEST_P(CursorTest, AdvanceMovesTheSlotsOfTheRowsAndWrapsAtL) {
  Buffer& cursors = ints({0, 1, 2, 3, 0, 3});
  Buffer& indices = ints({5, 3, -1, 0, 2});
  advance(cursors, 4, &indices);
  // Slots 5 and 3 were at L - 1 = 3 and wrap; slots 1 and 4 have no row; the pad row is skipped.
  EXPECT_EQ(read(cursors), (std::vector<int32_t>{1, 1, 3, 0, 0, 0}));
}

TEST_P(CursorTest, AdvanceSkipsPadRowsWhateverThePadId) {
  Buffer& cursors = ints({2, 0, 1});
  Buffer& all_pad = ints({-1, -1});
  advance(cursors, 3, &all_pad);
  EXPECT_EQ(read(cursors), (std::vector<int32_t>{2, 0, 1}));
  Buffer& custom_pad = ints({7, 1, 7});
  advance(cursors, 3, &custom_pad, 7);
  EXPECT_EQ(read(cursors), (std::vector<int32_t>{2, 1, 1}));
}

TEST_P(CursorTest, AdvanceWithoutIndicesMovesEverySlot) {
  Buffer& cursors = ints({0, 1, 2, 0, 1, 2});
  advance(cursors, 3, nullptr);
  EXPECT_EQ(read(cursors), (std::vector<int32_t>{1, 2, 0, 1, 2, 0}));
}

TEST_P(CursorTest, BufferLengthOneKeepsEveryCursorAtZero) {
  Buffer& cursors = ints({0, 0, 0});
  Buffer& indices = ints({2, 0});
  for (int i = 0; i < 3; ++i) {
    advance(cursors, 1, &indices);
    advance(cursors, 1, nullptr);
  }
  EXPECT_EQ(read(cursors), (std::vector<int32_t>{0, 0, 0}));
}

TEST_P(CursorTest, AdvancingKStepsAddsKModuloL) {
  const int64_t L = 7;
  const std::vector<int32_t> start{0, 3, 6, 5, 1};
  Buffer& cursors = ints(start);
  Buffer& indices = ints({4, 1, -1, 0});  // slots 2 and 3 stay where they are
  for (int k = 1; k <= 2 * L; ++k) {
    advance(cursors, L, &indices);
    const std::vector<int32_t> now = read(cursors);
    for (int slot : {0, 1, 4}) EXPECT_EQ(now[slot], (start[slot] + k) % L) << "slot " << slot << ", k " << k;
    for (int slot : {2, 3}) EXPECT_EQ(now[slot], start[slot]) << "slot " << slot << ", k " << k;
  }
}

TEST_P(CursorTest, AdvanceWithAnEmptyBatchChangesNothing) {
  Buffer& cursors = ints({1, 2});
  Buffer& no_rows = ints({});
  advance(cursors, 4, &no_rows);
  EXPECT_EQ(read(cursors), (std::vector<int32_t>{1, 2}));
}

TEST_P(CursorTest, ResetZeroesTheListedSlotsOnly) {
  Buffer& cursors = ints({3, 1, 2, 3, 2, 1});
  Buffer& slots = ints({4, -1, 0});
  reset(cursors, slots);
  EXPECT_EQ(read(cursors), (std::vector<int32_t>{0, 1, 2, 3, 0, 1}));
}

TEST_P(CursorTest, ResetSkipsPadEntriesWhateverThePadId) {
  Buffer& cursors = ints({3, 1, 2});
  Buffer& slots = ints({99, 2, 99});
  reset(cursors, slots, 99);
  EXPECT_EQ(read(cursors), (std::vector<int32_t>{3, 1, 0}));
}

TEST_P(CursorTest, ResetOfNoSlotsChangesNothing) {
  Buffer& cursors = ints({3, 1});
  Buffer& slots = ints({});
  reset(cursors, slots);
  EXPECT_EQ(read(cursors), (std::vector<int32_t>{3, 1}));
}

INSTANTIATE_TEST_SUITE_P(Backends, CursorTest,
                         ::testing::Values(Backend::kReference, Backend::kCpu, Backend::kCuda),
                         [](const auto& info) { return std::string(backend_name(info.param)); });

}  // namespace
}  // namespace replayssm::test
