// The library's fp16 and bf16 conversions: fp16 against the compiler's _Float16, bf16 against a
// direct round-to-nearest-even reference; exhaustive over the 16-bit values, plus every halfway
// case and many random floats (subnormals, infinities and NaNs included).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "replayssm/dtype.hpp"

namespace replayssm {
namespace {

// Inputs that stress rounding: every 32-bit pattern class, drawn at random.
std::vector<float> random_floats(size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> values;
  values.reserve(count);
  for (size_t i = 0; i < count; ++i) values.push_back(bits_float(uint32_t(rng())));
  // Magnitudes around the fp16 subnormal and overflow ranges, where fp16 rounding is special.
  std::uniform_real_distribution<float> tiny(0.f, 1.f / 16384), large(60000.f, 70000.f);
  for (size_t i = 0; i < count / 4; ++i) {
    values.push_back(tiny(rng));
    values.push_back(-large(rng));
  }
  return values;
}

std::vector<float> special_floats() {
  const float inf = std::numeric_limits<float>::infinity();
  return {0.f, -0.f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
          bits_float(0x7f800001u) /* signalling NaN */, std::numeric_limits<float>::max(),
          -std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
          std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
          65504.f, 65519.99f, 65520.f, -65520.f, 1.f / 16777216, 1.f / 33554432, 3.f / 33554432};
}

#if defined(__FLT16_MAX__)

uint16_t compiler_to_fp16(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

float compiler_fp16_to_float(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return static_cast<float>(h);
}

bool is_fp16_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }

// Expects the library and the compiler to agree on float -> fp16 (any NaN for a NaN, same sign).
void expect_fp16_like_compiler(const std::vector<float>& inputs) {
  int64_t mismatches = 0;
  for (float f : inputs) {
    const uint16_t expected = compiler_to_fp16(f), actual = float_to_fp16(f);
    const bool same = std::isnan(f) ? is_fp16_nan(actual) && (actual & 0x8000u) == (expected & 0x8000u)
                                    : actual == expected;
    if (!same && mismatches++ < 5)
      ADD_FAILURE() << "float_to_fp16(" << f << " = 0x" << std::hex << float_bits(f) << ") = 0x" << actual
                    << ", compiler 0x" << expected;
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(Fp16, ToFloatMatchesTheCompilerForEveryHalf) {
  int64_t mismatches = 0;
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const float expected = compiler_fp16_to_float(uint16_t(h)), actual = fp16_to_float(uint16_t(h));
    const bool same = std::isnan(expected)
                          ? std::isnan(actual) && std::signbit(actual) == std::signbit(expected)
                          : float_bits(actual) == float_bits(expected);
    if (!same && mismatches++ < 5)
      ADD_FAILURE() << "fp16_to_float(0x" << std::hex << h << ") = " << actual << ", compiler " << expected;
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(Fp16, FromFloatMatchesTheCompilerOnEveryHalfEveryHalfwayCaseAndTheirNeighbours) {
  std::vector<float> inputs;
  for (uint32_t h = 0; h < 0x7c00u; ++h) {  // every finite positive half, then its negative
    const double value = fp16_to_float(uint16_t(h));
    // The next half up; above 65504 that is 65536, the boundary where RNE overflows to inf.
    const double next = h + 1 == 0x7c00u ? 65536.0 : double(fp16_to_float(uint16_t(h + 1)));
    const float halfway = float((value + next) / 2);  // exact: 12 significant bits at most
    for (float f : {float(value), halfway, std::nextafter(halfway, 0.f), std::nextafter(halfway, 1e30f)}) {
      inputs.push_back(f);
      inputs.push_back(-f);
    }
  }
  expect_fp16_like_compiler(inputs);
}

TEST(Fp16, FromFloatMatchesTheCompilerOnRandomAndSpecialFloats) {
  expect_fp16_like_compiler(random_floats(2'000'000, 16));
  expect_fp16_like_compiler(special_floats());
}

#else

TEST(Fp16, CompilerHasFloat16) { GTEST_SKIP() << "this compiler has no _Float16 to compare with"; }

#endif

TEST(Fp16, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const bool nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
    if (nan) continue;
    ASSERT_EQ(float_to_fp16(fp16_to_float(uint16_t(h))), h) << std::hex << "0x" << h;
  }
}

// bf16 value of `bits` by its definition, with the all-ones exponent standing for 2^128 so that
// "round up past the largest finite value" is a plain comparison.
double bf16_value_by_definition(uint16_t bits) {
  const int exponent = (bits >> 7) & 0xff, mantissa = bits & 0x7f;
  const double magnitude = exponent == 0 ? std::ldexp(mantissa, -133)
                                         : std::ldexp(1.0 + mantissa / 128.0, exponent - 127);
  return (bits & 0x8000u) ? -magnitude : magnitude;
}

// Round to nearest, ties to even, written the obvious way: pick the nearer of the two bf16
// neighbours of |f|, the even one on a tie.
uint16_t reference_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint16_t below = uint16_t((u >> 16) & 0x7fffu);  // truncation: the neighbour towards zero
  const uint16_t above = uint16_t(below + 1);
  if ((u & 0xffffu) == 0) return uint16_t(sign | below);
  const double magnitude = std::fabs(double(f));
  const double to_below = magnitude - bf16_value_by_definition(below);
  const double to_above = bf16_value_by_definition(above) - magnitude;
  const bool up = to_above < to_below || (to_above == to_below && (below & 1u));
  return uint16_t(sign | (up ? above : below));
}

void expect_bf16_like_reference(const std::vector<float>& inputs) {
  int64_t mismatches = 0;
  for (float f : inputs) {
    const uint16_t actual = float_to_bf16(f);
    bool same;
    if (std::isnan(f)) {  // a quiet NaN of the same sign
      same = (actual & 0x7f80u) == 0x7f80u && (actual & 0x40u) && (actual & 0x8000u) == ((float_bits(f) >> 16) & 0x8000u);
    } else {
      same = actual == reference_to_bf16(f);
    }
    if (!same && mismatches++ < 5)
      ADD_FAILURE() << "float_to_bf16(" << f << " = 0x" << std::hex << float_bits(f) << ") = 0x" << actual
                    << ", reference 0x" << reference_to_bf16(f);
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(Bf16, ToFloatMatchesTheDefinitionForEveryValue) {
  for (uint32_t b = 0; b <= 0xffffu; ++b) {
    const float actual = bf16_to_float(uint16_t(b));
    const int exponent = (b >> 7) & 0xff;
    if (exponent == 0xff) {
      const bool nan = (b & 0x7fu) != 0;
      ASSERT_EQ(std::isnan(actual), nan) << std::hex << "0x" << b;
      if (!nan) {
        ASSERT_EQ(actual, (b & 0x8000u) ? -INFINITY : INFINITY);
      }
      continue;
    }
    ASSERT_EQ(double(actual), bf16_value_by_definition(uint16_t(b))) << std::hex << "0x" << b;
  }
}

TEST(Bf16, FromFloatRoundsToNearestEvenAroundEveryValue) {
  // Every bf16 value with the dropped 16 bits at zero, just below / at / just above halfway, and
  // at the extremes: every halfway case and its neighbours.
  std::vector<float> inputs;
  for (uint32_t high = 0; high <= 0xffffu; ++high)
    for (uint32_t low : {0x0u, 0x1u, 0x7fffu, 0x8000u, 0x8001u, 0xfffeu, 0xffffu})
      inputs.push_back(bits_float((high << 16) | low));
  expect_bf16_like_reference(inputs);
}

TEST(Bf16, FromFloatRoundsToNearestEvenOnRandomAndSpecialFloats) {
  expect_bf16_like_reference(random_floats(2'000'000, 17));
  expect_bf16_like_reference(special_floats());
}

TEST(StorageTypes, ConvertThroughTheSameFunctions) {
  for (float f : random_floats(10'000, 18)) {
    if (std::isnan(f)) continue;
    EXPECT_EQ(from_float<Half>(f).bits, float_to_fp16(f));
    EXPECT_EQ(from_float<BFloat16>(f).bits, float_to_bf16(f));
    EXPECT_EQ(float_bits(to_float(Half{float_to_fp16(f)})), float_bits(fp16_to_float(float_to_fp16(f))));
    EXPECT_EQ(float_bits(to_float(BFloat16{float_to_bf16(f)})), float_bits(bf16_to_float(float_to_bf16(f))));
  }
}

}  // namespace
}  // namespace replayssm
