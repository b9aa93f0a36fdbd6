// The buffers the harness moves data through, on the host and on a CUDA device.
#include <cstdint>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "support/buffer.hpp"

namespace replayssm::test {
namespace {

class BufferTest : public ::testing::TestWithParam<Backend> {};

TEST_P(BufferTest, RoundTripsWholeAndPartialCopies) {
  REPLAYSSM_SKIP_IF_UNAVAILABLE(GetParam());
  Buffer buffer(device_for(GetParam()), 1000);
  std::vector<uint8_t> pattern(1000);
  std::iota(pattern.begin(), pattern.end(), uint8_t(7));
  buffer.upload(pattern);
  EXPECT_EQ(buffer.download(), pattern);

  const std::vector<uint8_t> patch{1, 2, 3, 4, 5};
  buffer.upload(patch.data(), 100, patch.size());
  std::vector<uint8_t> read_back(patch.size());
  buffer.download(read_back.data(), 100, read_back.size());
  EXPECT_EQ(read_back, patch);
  std::copy(patch.begin(), patch.end(), pattern.begin() + 100);
  EXPECT_EQ(buffer.download(), pattern);  // nothing outside the patch moved
}

TEST_P(BufferTest, ViewsPointIntoTheBufferOnItsDevice) {
  REPLAYSSM_SKIP_IF_UNAVAILABLE(GetParam());
  Buffer buffer(device_for(GetParam()), 6 * 4 * sizeof(float));
  const TensorView v = buffer.view(DType::kFloat32, {2, 3, 4}, {12, 4, 1}, 0);
  EXPECT_EQ(v.data, buffer.data());
  EXPECT_EQ(v.device.type, device_for(GetParam()).type);
  EXPECT_EQ(v.rank, 3);
  EXPECT_EQ(v.stride(0), 12);
  const TensorView offset = buffer.view(DType::kFloat32, {4}, {}, 5);
  EXPECT_EQ(static_cast<char*>(offset.data) - static_cast<char*>(buffer.data()), 5 * 4);
}

TEST_P(BufferTest, CopiesPastTheEndAreRefused) {
  REPLAYSSM_SKIP_IF_UNAVAILABLE(GetParam());
  Buffer buffer(device_for(GetParam()), 16);
  std::vector<uint8_t> host(17);
  EXPECT_THROW(buffer.upload(host.data(), 0, 17), std::out_of_range);
  EXPECT_THROW(buffer.download(host.data(), 8, 9), std::out_of_range);
  EXPECT_THROW(buffer.upload(host), std::invalid_argument);
}

TEST_P(BufferTest, MoveTransfersOwnership) {
  REPLAYSSM_SKIP_IF_UNAVAILABLE(GetParam());
  Buffer a(device_for(GetParam()), 64);
  void* data = a.data();
  Buffer b(std::move(a));
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(a.data(), nullptr);
  Buffer c;
  c = std::move(b);
  EXPECT_EQ(c.data(), data);
  EXPECT_EQ(c.bytes(), 64u);
}

INSTANTIATE_TEST_SUITE_P(Backends, BufferTest,
                         ::testing::Values(Backend::kReference, Backend::kCpu, Backend::kCuda),
                         [](const auto& info) { return std::string(backend_name(info.param)); });

}  // namespace
}  // namespace replayssm::test
