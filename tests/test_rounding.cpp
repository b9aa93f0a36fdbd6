// The flush's rounding rules (common/rounding.hpp) and the 8-bit formats (dtype.hpp): Philox
// against its published test vectors, e4m3 and int8 against independent brute-force references,
// the grid rounding against the existing fp16 / bf16 conversions, and stochastic rounding's
// neighbours, expectation and determinism.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "common/rounding.hpp"

namespace replayssm {
namespace {

// Random123's known-answer vectors for Philox-4x32-10 (counter, key, output).
TEST(Philox, MatchesThePublishedTestVectors) {
  struct Vector {
    uint32_t counter[4], key[2], output[4];
  };
  const Vector vectors[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Vector& v : vectors) {
    const Philox4x32 out = philox4x32_10(v.counter[0], v.counter[1], v.counter[2], v.counter[3], v.key[0], v.key[1]);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(out.word[w], v.output[w]) << "word " << w;
  }
}

// Element e of a flush draws word e % 4 of Philox(counter (e / 4, slot, flush count, 0), key seed).
TEST(FlushRandomBits, IsKeyedOnSeedSlotElementAndFlushCount) {
  FlushRandomBits bits(7, 11, 3, 5);
  for (uint32_t e : {0u, 1u, 2u, 3u, 4u, 9u, 1000003u, 2u}) {
    const Philox4x32 block = philox4x32_10(e / 4, 3, 5, 0, 7, 11);
    EXPECT_EQ(bits(e), block.word[e % 4]) << "element " << e;
  }
  // Every part of the key changes the bits.
  const uint32_t base = FlushRandomBits(7, 11, 3, 5)(42);
  EXPECT_NE(FlushRandomBits(8, 11, 3, 5)(42), base);
  EXPECT_NE(FlushRandomBits(7, 12, 3, 5)(42), base);
  EXPECT_NE(FlushRandomBits(7, 11, 4, 5)(42), base);
  EXPECT_NE(FlushRandomBits(7, 11, 3, 6)(42), base);
  EXPECT_NE(FlushRandomBits(7, 11, 3, 5)(43), base);
}

// The e4m3fn value of a byte, by the format's definition.
double e4m3_value(uint8_t b) {
  const int sign = b >> 7, exponent = (b >> 3) & 0xf, mantissa = b & 7;
  const double magnitude = exponent == 0 ? std::ldexp(mantissa / 8.0, -6)
                                         : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return sign ? -magnitude : magnitude;
}

TEST(Float8E4M3, DecodesEveryByte) {
  for (uint32_t b = 0; b < 256; ++b) {
    const float v = e4m3_to_float(uint8_t(b));
    if ((b & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << "byte " << b;
      continue;
    }
    EXPECT_EQ(double(v), e4m3_value(uint8_t(b))) << "byte " << b;
    EXPECT_EQ(float_to_e4m3(v), b) << "byte " << b << " does not encode back";
  }
  EXPECT_EQ(e4m3_to_float(0x7e), 448.f);
}

// Nearest finite e4m3 by brute force, ties to the even byte (the even mantissa), saturating.
uint8_t nearest_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const double magnitude = std::min<double>(std::fabs(f), 448.0);
  uint8_t best = 0;
  double best_distance = INFINITY;
  for (uint8_t b = 0; b < 0x7f; ++b) {
    const double d = std::fabs(e4m3_value(b) - magnitude);
    if (d < best_distance || (d == best_distance && (b & 1) == 0)) {
      best = b;
      best_distance = d;
    }
  }
  return uint8_t(best | (std::signbit(f) ? 0x80 : 0));
}

std::vector<float> values_around(float lo, float hi, size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(lo, hi);
  std::vector<float> values;
  for (size_t i = 0; i < count; ++i) values.push_back(uniform(rng));
  return values;
}

TEST(Float8E4M3, RoundsToNearestEvenAndSaturates) {
  std::vector<float> inputs = values_around(-600.f, 600.f, 20000, 1);
  for (float f : values_around(-0.02f, 0.02f, 20000, 2)) inputs.push_back(f);
  // Every midpoint between neighbours: the ties.
  for (uint8_t b = 0; b < 0x7e; ++b) {
    const float mid = float((e4m3_value(b) + e4m3_value(uint8_t(b + 1))) / 2);
    inputs.push_back(mid);
    inputs.push_back(-mid);
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float f : {0.f, -0.f, 448.f, 463.99f, 464.f, 1e30f, inf, -inf, std::numeric_limits<float>::denorm_min()})
    inputs.push_back(f);
  int64_t mismatches = 0;
  for (float f : inputs) {
    const uint8_t expected = nearest_e4m3(f), actual = float_to_e4m3(f);
    if (actual != expected && mismatches++ < 5)
      ADD_FAILURE() << "float_to_e4m3(" << f << ") = " << int(actual) << ", expected " << int(expected);
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(float_to_e4m3(inf), 0x7e);
  EXPECT_EQ(float_to_e4m3(-inf), 0xfe);
  EXPECT_TRUE(std::isnan(e4m3_to_float(float_to_e4m3(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Int8, RoundsToNearestEvenAndSaturatesSymmetrically) {
  std::vector<float> inputs = values_around(-200.f, 200.f, 20000, 3);
  for (int k = -130; k <= 130; ++k) inputs.push_back(float(k) + 0.5f);  // ties
  for (float f : {0.f, -0.f, 127.49f, 127.5f, -128.f, -127.5f, 1e30f, -1e30f}) inputs.push_back(f);
  for (float f : inputs) {
    const double expected = std::clamp(std::nearbyint(double(f)), -127.0, 127.0);  // ties to even
    EXPECT_EQ(double(float_to_int8(f)), expected) << "float_to_int8(" << f << ")";
  }
  EXPECT_EQ(float_to_int8(std::numeric_limits<float>::quiet_NaN()), 0);
}

// Random floats of every class, as test_dtype.cpp draws them.
std::vector<float> random_floats(size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> values;
  for (size_t i = 0; i < count; ++i) values.push_back(bits_float(uint32_t(rng())));
  return values;
}

// The grid rounding to nearest even is the same as the fp16 / bf16 conversions.
TEST(RoundToGrid, ToNearestEvenMatchesTheSixteenBitConversions) {
  std::vector<float> inputs = random_floats(200000, 4);
  for (float f : values_around(-1.f / 8192, 1.f / 8192, 20000, 5)) inputs.push_back(f);
  for (float f : values_around(-70000.f, 70000.f, 20000, 6)) inputs.push_back(f);
  int64_t mismatches = 0;
  for (float f : inputs) {
    if (std::isnan(f)) continue;
    const uint16_t half = float_to_fp16(round_to_grid(f, CheckpointFormat<Half>::kGrid, false, 0));
    const uint16_t bf16 = float_to_bf16(round_to_grid(f, CheckpointFormat<BFloat16>::kGrid, false, 0));
    if ((half != float_to_fp16(f) || bf16 != float_to_bf16(f)) && mismatches++ < 5)
      ADD_FAILURE() << "round_to_grid(" << f << ") differs from the 16-bit conversions";
  }
  EXPECT_EQ(mismatches, 0);
}

// Stochastic rounding of v with the extreme random words gives its two grid neighbours, and any
// word gives one of them: the magnitude rounded down or up.
template <typename S> void expect_neighbours(const std::vector<float>& inputs) {
  const FloatGrid grid = CheckpointFormat<S>::kGrid;
  for (float v : inputs) {
    const float down = round_to_grid(v, grid, true, 0), up = round_to_grid(v, grid, true, 0xffffffffu);
    EXPECT_LE(std::fabs(down), std::fabs(v)) << v;
    EXPECT_GE(std::fabs(up), std::fabs(v)) << v;
    if (down != v) {
      EXPECT_NE(down, up) << v;
    }
    // Neighbours: nothing on the grid lies strictly between them.
    const float middle = round_to_grid((down + up) / 2, grid, false, 0);
    EXPECT_TRUE(middle == down || middle == up) << v;
    for (uint32_t r : {1u, 0x7fffffffu, 0x80000000u, 0xfffffffeu, 12345u}) {
      const float g = round_to_grid(v, grid, true, r);
      EXPECT_TRUE(g == down || g == up) << v << " with random word " << r;
    }
  }
}

TEST(StochasticRounding, GivesOneOfTheTwoNeighbours) {
  const std::vector<float> inputs = values_around(-300.f, 300.f, 2000, 7);
  const std::vector<float> small = values_around(-1e-5f, 1e-5f, 2000, 8);  // fp16 and e4m3 subnormals
  expect_neighbours<Half>(inputs);
  expect_neighbours<Half>(small);
  expect_neighbours<BFloat16>(inputs);
  expect_neighbours<BFloat16>(small);
  expect_neighbours<Float8E4M3>(inputs);
  expect_neighbours<Float8E4M3>(values_around(-0.02f, 0.02f, 2000, 9));
  expect_neighbours<Int8>(values_around(-127.f, 127.f, 2000, 10));
}

// The mean of many stochastic roundings of v converges to v (5 standard errors).
template <typename S> void expect_unbiased(float v, float scale) {
  constexpr int kDraws = 40000;
  FlushRandomBits bits(1, 2, 3, 4);
  double sum = 0;
  for (int k = 0; k < kDraws; ++k) sum += dequantise(round_stochastic<S>(v / scale, bits(uint32_t(k))), scale);
  const FloatGrid grid = CheckpointFormat<S>::kGrid;
  const double down = scale * round_to_grid(v / scale, grid, true, 0);
  const double up = scale * round_to_grid(v / scale, grid, true, 0xffffffffu);
  const double p = (double(v) - down) / (up - down);
  const double standard_error = std::fabs(up - down) * std::sqrt(p * (1 - p) / kDraws);
  EXPECT_NEAR(sum / kDraws, v, 5 * standard_error + 1e-12) << "v = " << v;
  EXPECT_GT(p, 0.05);  // the value is well inside a step, so the test has power
  EXPECT_LT(p, 0.95);
}

TEST(StochasticRounding, IsUnbiasedInExpectation) {
  expect_unbiased<Half>(1.0f + 0.3f / 1024, 1.f);
  expect_unbiased<Half>(-3.7e-6f, 1.f);  // subnormal
  expect_unbiased<BFloat16>(0.1234567f, 1.f);
  expect_unbiased<BFloat16>(-1000.7f, 1.f);
  expect_unbiased<Float8E4M3>(0.3f, 1.f);
  expect_unbiased<Float8E4M3>(-5e-3f, 1.f);  // subnormal
  expect_unbiased<Int8>(0.3737f, 0.01f);
  expect_unbiased<Int8>(-1.111f, 0.01f);
  // Round to nearest is biased on the same value: the reason for stochastic rounding.
  EXPECT_EQ(to_float(from_float<Float8E4M3>(0.3f)), 0.3125f);
}

// One row of a flushed checkpoint: the scale maps the absmax to the format's max, every element
// is within half a step (nearest) or one step (stochastic), and the same key gives the same bits.
template <typename S> void expect_row_rounding(bool stochastic) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> values(200);
  for (float& v : values) v = normal(rng);
  std::vector<S> stored(values.size()), again(values.size());
  float scale = -1, scale_again = -1;
  FlushRandomBits bits(5, 6, 7, 8), same_bits(5, 6, 7, 8);
  round_checkpoint_row(values.data(), int64_t(values.size()), stored.data(), &scale, stochastic, bits, 40);
  round_checkpoint_row(values.data(), int64_t(values.size()), again.data(), &scale_again, stochastic, same_bits, 40);
  float absmax = 0;
  for (float v : values) absmax = std::max(absmax, std::fabs(v));
  EXPECT_EQ(scale, absmax / CheckpointFormat<S>::kMax);
  EXPECT_EQ(scale_again, scale);
  bool reaches_max = false;
  for (size_t k = 0; k < values.size(); ++k) {
    const float stored_value = to_float(stored[k]);
    EXPECT_EQ(stored_value, to_float(again[k])) << k;
    reaches_max |= std::fabs(stored_value) == CheckpointFormat<S>::kMax;
    const FloatGrid grid = CheckpointFormat<S>::kGrid;
    const float t = values[k] / scale;
    const double step = double(round_to_grid(t, grid, true, 0xffffffffu)) - round_to_grid(t, grid, true, 0);
    const double error = std::fabs(double(stored_value) - t);
    EXPECT_LE(error, (stochastic ? 1.0 : 0.5) * std::fabs(step) + 1e-6) << k;
  }
  EXPECT_TRUE(reaches_max);
}

TEST(CheckpointRow, Int8ScaleAndRounding) {
  expect_row_rounding<Int8>(false);
  expect_row_rounding<Int8>(true);
}

TEST(CheckpointRow, Float8ScaleAndRounding) {
  expect_row_rounding<Float8E4M3>(false);
  expect_row_rounding<Float8E4M3>(true);
}

TEST(CheckpointRow, ZeroRowStoresZerosWithScaleZero) {
  const std::vector<float> zeros(16, 0.f);
  std::vector<Int8> stored(16, Int8{5});
  float scale = -1;
  FlushRandomBits bits(0, 0, 0, 0);
  round_checkpoint_row(zeros.data(), 16, stored.data(), &scale, true, bits, 0);
  EXPECT_EQ(scale, 0.f);
  for (Int8 s : stored) EXPECT_EQ(s.value, 0);
  EXPECT_EQ(dequantise(stored[0], scale), 0.f);
}

// fp16 / bf16 rows: round to nearest is from_float; stochastic rounding uses element
// first_element + k's bits.
TEST(CheckpointRow, SixteenBitRowsUseTheirElementsBits) {
  const std::vector<float> values = values_around(-2.f, 2.f, 9, 12);
  std::vector<BFloat16> nearest(9), stochastic(9);
  FlushRandomBits bits(1, 1, 1, 1), reference_bits(1, 1, 1, 1);
  round_checkpoint_row(values.data(), 9, nearest.data(), nullptr, false, bits, 6);
  round_checkpoint_row(values.data(), 9, stochastic.data(), nullptr, true, bits, 6);
  int differ = 0;
  for (size_t k = 0; k < 9; ++k) {
    EXPECT_EQ(nearest[k].bits, float_to_bf16(values[k]));
    EXPECT_EQ(stochastic[k].bits, round_stochastic<BFloat16>(values[k], reference_bits(uint32_t(6 + k))).bits);
    differ += nearest[k].bits != stochastic[k].bits;
  }
  EXPECT_GT(differ, 0);
}

}  // namespace
}  // namespace replayssm
