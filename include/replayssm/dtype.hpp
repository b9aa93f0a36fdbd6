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
};

inline int64_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kFloat64: return 8;
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
  }
  return "unknown";
}

inline bool is_floating(DType t) { return t != DType::kInt32; }

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

REPLAYSSM_HOST_DEVICE uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

REPLAYSSM_HOST_DEVICE float fp16_to_float(uint16_t h) {
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
}

REPLAYSSM_HOST_DEVICE uint16_t float_to_fp16(float f) {
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
}

// Storage types by tag, for templated kernels.
struct Half { uint16_t bits; };
struct BFloat16 { uint16_t bits; };

REPLAYSSM_HOST_DEVICE float to_float(float v) { return v; }
REPLAYSSM_HOST_DEVICE float to_float(double v) { return float(v); }
REPLAYSSM_HOST_DEVICE float to_float(Half v) { return fp16_to_float(v.bits); }
REPLAYSSM_HOST_DEVICE float to_float(BFloat16 v) { return bf16_to_float(v.bits); }

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

// Rounds a float to the storage type T.
template <typename T> REPLAYSSM_HOST_DEVICE T from_float(float f) { return FromFloat<T>::convert(f); }

}  // namespace replayssm
