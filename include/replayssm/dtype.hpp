// Element types and their conversions, usable on the host and in CUDA device code.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define REPLAYSSM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define REPLAYSSM_HOST_DEVICE inline
#endif

namespace replayssm {

enum class DType : int32_t {
  kFloat32,
  kFloat16,
  kBFloat16,
  kFloat64,  // accepted by the reference backend only (the fp64 oracle's state)
  kInt32,
  kInt8,        // checkpoints only, with an fp32 scale per (slot, head, row of P)
  kFloat8E4M3,  // checkpoints only, with a scale as kInt8; the "fn" variant: max 448, no infinities
};

inline int64_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kFloat64: return 8;
    case DType::kInt8:
    case DType::kFloat8E4M3: return 1;
    default: return 4;
  }
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat64: return "float64";
    case DType::kInt32: return "int32";
    case DType::kInt8: return "int8";
    case DType::kFloat8E4M3: return "float8_e4m3fn";
  }
  return "unknown";
}

// The 8-bit checkpoint formats, stored as value / scale.
inline bool is_scaled_checkpoint(DType t) { return t == DType::kInt8 || t == DType::kFloat8E4M3; }

// Bit-level conversions (round to nearest even), identical on host and device so that every
// backend rounds a value to 16 bits the same way.
REPLAYSSM_HOST_DEVICE uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

REPLAYSSM_HOST_DEVICE float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

REPLAYSSM_HOST_DEVICE float bf16_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

// On the device one instruction (the same value for every input but NaN, as for fp16 below).
REPLAYSSM_HOST_DEVICE uint16_t float_to_bf16(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
#endif
}

// On the device, fp16 and e4m3 convert by one instruction (the same value for every input but
// NaN, whose payload may differ); the host spells the conversion out.
REPLAYSSM_HOST_DEVICE float fp16_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / nan
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    // Subnormal: renormalise.
    exp = 127 - 15 + 1;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    mant &= 0x3ffu;
    return bits_float(sign | (exp << 23) | (mant << 13));
  }
  return bits_float(sign | ((exp + 127 - 15) << 23) | (mant << 13));
#endif
}

REPLAYSSM_HOST_DEVICE uint16_t float_to_fp16(float f) {
#if defined(__CUDA_ARCH__)
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  const uint32_t u = float_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);    // nan
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);   // rounds to inf
  if (abs < 0x38800000u) {                                   // fp16 subnormal or zero
    if (abs < 0x33000000u) return sign;                      // below half the smallest subnormal
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;                        // 14..24
    const uint32_t half_mant = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    const uint32_t rounded = half_mant + ((rem > halfway || (rem == halfway && (half_mant & 1u))) ? 1u : 0u);
    return uint16_t(sign | rounded);
  }
  uint32_t r = abs - 0x38000000u;                            // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return uint16_t(sign | (r >> 13));
#endif
}

// A binary floating-point grid: `mantissa_bits` fraction bits, smallest normal exponent
// `min_exponent` with evenly spaced subnormals below it, unbounded above (the caller saturates).
// fp16 is {10, -14}, bf16 {7, -126}, e4m3 {3, -6}; the integers 0..255 are the grid {7, 7}, which
// has only "subnormals" of spacing 1 there.
struct FloatGrid {
  int mantissa_bits;
  int min_exponent;
};

// 2^k as a float, exactly, for k in [-149, 127] (subnormal below -126).
REPLAYSSM_HOST_DEVICE float exact_power_of_two(int k) {
  return k >= -126 ? bits_float(uint32_t(k + 127) << 23) : bits_float(1u << (k + 149));
}

// v rounded to `grid`: to nearest even, or, when `stochastic`, up with probability equal to the
// fraction of the grid step by which v exceeds the grid point below it (in magnitude), drawn from
// the 32 bits of `random` (uniform in [0, 2^32)). Integer arithmetic on v's significand, so every
// compiler and device gives the same bits; infinities and NaNs pass through.
REPLAYSSM_HOST_DEVICE float round_to_grid(float v, FloatGrid grid, bool stochastic, uint32_t random) {
  const uint32_t u = float_bits(v);
  const uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) return v;
  const uint32_t exponent_field = magnitude >> 23;
  const int exponent = exponent_field ? int(exponent_field) - 127 : -126;
  const uint64_t significand = exponent_field ? (magnitude & 0x7fffffu) | 0x800000u : magnitude;
  // |v| = significand 2^(exponent - 23); the grid step there is 2^step_exponent.
  const int step_exponent = (exponent > grid.min_exponent ? exponent : grid.min_exponent) - grid.mantissa_bits;
  const int shift = step_exponent - (exponent - 23);  // >= 0 for grids no finer than fp32
  // |v| in grid steps, fixed point with 32 fraction bits (bits past 2^-32 steps only occur below
  // 2^-8 steps, where they cannot change the result).
  const uint64_t steps = shift <= 32 ? significand << (32 - shift) : shift < 64 ? significand >> (shift - 32) : 0;
  uint64_t whole = steps >> 32;
  const uint64_t fraction = steps & 0xffffffffu;
  if (stochastic) {
    whole += (fraction + random) >> 32;
  } else if (fraction > 0x80000000u || (fraction == 0x80000000u && (whole & 1u))) {
    ++whole;
  }
  // whole < 2^(mantissa_bits + 2) is exact in a float, and so is its product with the step.
  const float rounded = float(whole) * exact_power_of_two(step_exponent);
  return bits_float(float_bits(rounded) | (u & 0x80000000u));
}

constexpr FloatGrid kFloat8E4M3Grid{3, -6};
constexpr FloatGrid kIntegerGrid{7, 7};  // the integers, exact up to 255
constexpr float kFloat8E4M3Max = 448.f;
constexpr float kInt8Max = 127.f;  // symmetric: -128 is never produced

REPLAYSSM_HOST_DEVICE float e4m3_to_float(uint8_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t pair;  // two fp16, the low one b's value
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(pair) : "h"(uint16_t(b)));
  return fp16_to_float(uint16_t(pair & 0xffffu));
#else
  const uint32_t sign = uint32_t(b & 0x80u) << 24;
  const uint32_t exponent = (b >> 3) & 0xfu, mantissa = b & 0x7u;
  if (exponent == 0xfu && mantissa == 0x7u) return bits_float(sign | 0x7fc00000u);  // NaN
  if (exponent == 0) return bits_float(sign | float_bits(float(mantissa) * exact_power_of_two(-9)));
  return bits_float(sign | ((exponent + 127 - 7) << 23) | (mantissa << 20));
#endif
}

// Encodes a value already on the e4m3 grid, saturating magnitudes above 448 (infinities
// included) to 448; NaN stays NaN.
REPLAYSSM_HOST_DEVICE uint8_t e4m3_from_grid(float g) {
  const uint32_t u = float_bits(g);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return uint8_t(sign | 0x7fu);
  if (magnitude >= 0x43e00000u) return uint8_t(sign | 0x7eu);  // >= 448
  const uint32_t exponent_field = magnitude >> 23;
  if (exponent_field < 127 - 6)  // subnormal: a multiple of 2^-9
    return uint8_t(sign | uint32_t(bits_float(magnitude) * exact_power_of_two(9)));
  return uint8_t(sign | ((exponent_field - 127 + 7) << 3) | ((magnitude >> 20) & 0x7u));
}

// Saturating round to nearest even, as __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3).
REPLAYSSM_HOST_DEVICE uint8_t float_to_e4m3(float f) {
  return e4m3_from_grid(round_to_grid(f, kFloat8E4M3Grid, false, 0));
}

// Encodes an integer-valued float, saturating to [-127, 127]; NaN becomes 0.
REPLAYSSM_HOST_DEVICE int8_t int8_from_grid(float g) {
  if (!(g == g)) return 0;
  return int8_t(g > kInt8Max ? kInt8Max : g < -kInt8Max ? -kInt8Max : g);
}

// Saturating round to nearest even.
REPLAYSSM_HOST_DEVICE int8_t float_to_int8(float f) {
  return int8_from_grid(round_to_grid(f, kIntegerGrid, false, 0));
}

// Storage types by tag, for templated kernels.
struct Half { uint16_t bits; };
struct BFloat16 { uint16_t bits; };
struct Float8E4M3 { uint8_t bits; };
struct Int8 { int8_t value; };

REPLAYSSM_HOST_DEVICE float to_float(float v) { return v; }
REPLAYSSM_HOST_DEVICE float to_float(double v) { return float(v); }
REPLAYSSM_HOST_DEVICE float to_float(Half v) { return fp16_to_float(v.bits); }
REPLAYSSM_HOST_DEVICE float to_float(BFloat16 v) { return bf16_to_float(v.bits); }
REPLAYSSM_HOST_DEVICE float to_float(Float8E4M3 v) { return e4m3_to_float(v.bits); }
REPLAYSSM_HOST_DEVICE float to_float(Int8 v) { return float(v.value); }

template <typename T> struct FromFloat;
template <> struct FromFloat<float> {
  REPLAYSSM_HOST_DEVICE static float convert(float f) { return f; }
};
template <> struct FromFloat<double> {
  REPLAYSSM_HOST_DEVICE static double convert(float f) { return f; }
};
template <> struct FromFloat<Half> {
  REPLAYSSM_HOST_DEVICE static Half convert(float f) { return Half{float_to_fp16(f)}; }
};
template <> struct FromFloat<BFloat16> {
  REPLAYSSM_HOST_DEVICE static BFloat16 convert(float f) { return BFloat16{float_to_bf16(f)}; }
};
template <> struct FromFloat<Float8E4M3> {
  REPLAYSSM_HOST_DEVICE static Float8E4M3 convert(float f) { return Float8E4M3{float_to_e4m3(f)}; }
};
template <> struct FromFloat<Int8> {
  REPLAYSSM_HOST_DEVICE static Int8 convert(float f) { return Int8{float_to_int8(f)}; }
};

// Rounds a float to the storage type T.
template <typename T> REPLAYSSM_HOST_DEVICE T from_float(float f) { return FromFloat<T>::convert(f); }

}  // namespace replayssm
