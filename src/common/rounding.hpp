// How a flush writes the checkpoint, shared by every backend (host and CUDA device code) so that
// the same fp32 state gives the same checkpoint bits everywhere:
//   - the counter-based generator (Philox-4x32-10) that stochastic rounding draws from;
//   - rounding an fp32 value to the checkpoint format, to nearest even or stochastically;
//   - the 8-bit formats' scale per (slot, head, row of P) and their quantisation.
//
// Stochastic rounding: element e (the flat index h * P * N + i * N + n of the slot's (H, P, N)
// checkpoint) of slot `slot` at that slot's flush number `flush_count` draws word e % 4 of
// Philox-4x32-10(counter = (e / 4, slot, flush_count, 0), key = (seed[0], seed[1])). The result
// depends on nothing else (no thread, block or memory layout), so it is deterministic for a seed,
// identical on every backend, and needs no state besides the seed and the flush counts, which live
// in device memory (CUDA-graph safe).
//
// 8-bit checkpoints: value = scale * stored, with one fp32 scale per (slot, head, row of P). At a
// flush the row's scale is absmax / format max (127 for int8, 448 for e4m3) and each element is
// stored as round(value / scale) in the format, saturated; a row of zeros (or one whose scale
// underflows to zero) stores zeros with scale 0. absmax is a max, so it does not depend on the
// order in which a backend reduces the row.
#pragma once

#include <cstdint>
#include <type_traits>

#include "replayssm/dtype.hpp"

namespace replayssm {

struct Philox4x32 {
  uint32_t word[4];
};

// Philox-4x32 with 10 rounds (Salmon et al., SC'11; the Random123 reference constants).
REPLAYSSM_HOST_DEVICE Philox4x32 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                              uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c0, p1 = uint64_t(0xCD9E8D57u) * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0), hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4x32{{c0, c1, c2, c3}};
}

// The random bits of one slot's flush, element by element; one generator call serves four
// consecutive elements.
class FlushRandomBits {
 public:
  REPLAYSSM_HOST_DEVICE FlushRandomBits(uint32_t seed0, uint32_t seed1, uint32_t slot, uint32_t flush_count)
      : seed0_(seed0), seed1_(seed1), slot_(slot), flush_count_(flush_count) {}

  REPLAYSSM_HOST_DEVICE uint32_t operator()(uint32_t element) {
    const uint32_t block = element >> 2;
    if (!valid_ || block != block_) {
      words_ = philox4x32_10(block, slot_, flush_count_, 0, seed0_, seed1_);
      block_ = block;
      valid_ = true;
    }
    return words_.word[element & 3u];
  }

 private:
  uint32_t seed0_, seed1_, slot_, flush_count_;
  uint32_t block_ = 0;
  bool valid_ = false;
  Philox4x32 words_{};
};

// What a checkpoint format needs at a flush: its grid, and for the 8-bit ones the largest stored
// magnitude that the row's absmax maps to.
template <typename S> struct CheckpointFormat;
template <> struct CheckpointFormat<float> {
  static constexpr bool kScaled = false;
};
template <> struct CheckpointFormat<Half> {
  static constexpr bool kScaled = false;
  static constexpr FloatGrid kGrid{10, -14};
};
template <> struct CheckpointFormat<BFloat16> {
  static constexpr bool kScaled = false;
  static constexpr FloatGrid kGrid{7, -126};
};
template <> struct CheckpointFormat<Float8E4M3> {
  static constexpr bool kScaled = true;
  static constexpr FloatGrid kGrid = kFloat8E4M3Grid;
  static constexpr float kMax = kFloat8E4M3Max;
};
template <> struct CheckpointFormat<Int8> {
  static constexpr bool kScaled = true;
  static constexpr FloatGrid kGrid = kIntegerGrid;
  static constexpr float kMax = kInt8Max;
};

// v rounded to S stochastically with the 32 bits `random`: up or down to a neighbour on S's grid,
// up with probability (|v| - |down|) / (|up| - |down|), so the expected result is v. The 8-bit
// formats saturate; fp16 and bf16 overflow to infinity as their round-to-nearest does.
template <typename S> REPLAYSSM_HOST_DEVICE S round_stochastic(float v, uint32_t random) {
  const float g = round_to_grid(v, CheckpointFormat<S>::kGrid, true, random);
  if constexpr (std::is_same_v<S, Half>) return Half{float_to_fp16(g)};
  else if constexpr (std::is_same_v<S, BFloat16>) return BFloat16{float_to_bf16(g)};
  else if constexpr (std::is_same_v<S, Float8E4M3>) return Float8E4M3{e4m3_from_grid(g)};
  else return Int8{int8_from_grid(g)};
}

// v rounded to S: to nearest even, or stochastically with the 32 bits `random`.
template <typename S> REPLAYSSM_HOST_DEVICE S round_checkpoint(float v, bool stochastic, uint32_t random) {
  if constexpr (std::is_same_v<S, float>) return v;
  else return stochastic ? round_stochastic<S>(v, random) : from_float<S>(v);
}

// The scale of an 8-bit checkpoint row from the largest magnitude in it.
template <typename S> REPLAYSSM_HOST_DEVICE float checkpoint_scale(float row_absmax) {
  return row_absmax / CheckpointFormat<S>::kMax;
}

// An 8-bit element of a row with scale `scale`, rounded as round_checkpoint.
template <typename S>
REPLAYSSM_HOST_DEVICE S quantise(float v, float scale, bool stochastic, uint32_t random) {
  if (scale == 0.f) return S{0};
  return round_checkpoint<S>(v / scale, stochastic, random);
}

// The value of a stored checkpoint element; `scale` is read only by the 8-bit formats.
template <typename S> REPLAYSSM_HOST_DEVICE float dequantise(S stored, float scale) {
  if constexpr (CheckpointFormat<S>::kScaled) return scale * to_float(stored);
  else return to_float(stored);
}

// Rounds row i of head h of a flushed checkpoint: `count` fp32 values whose first one is element
// `first_element` of the slot's (H, P, N) checkpoint. For the 8-bit formats it also writes the
// row's scale. `random` is read only when `stochastic`.
template <typename S>
REPLAYSSM_HOST_DEVICE void round_checkpoint_row(const float* values, int64_t count, S* stored,
                                                float* scale, bool stochastic, FlushRandomBits& random,
                                                uint32_t first_element) {
  float row_scale = 0.f;
  if constexpr (CheckpointFormat<S>::kScaled) {
    float absmax = 0.f;
    for (int64_t k = 0; k < count; ++k) {
      const float magnitude = bits_float(float_bits(values[k]) & 0x7fffffffu);
      absmax = magnitude > absmax ? magnitude : absmax;
    }
    row_scale = checkpoint_scale<S>(absmax);
    *scale = row_scale;
  }
  for (int64_t k = 0; k < count; ++k) {
    const uint32_t bits = stochastic ? random(first_element + uint32_t(k)) : 0u;
    if constexpr (CheckpointFormat<S>::kScaled) stored[k] = quantise<S>(values[k], row_scale, stochastic, bits);
    else stored[k] = round_checkpoint<S>(values[k], stochastic, bits);
  }
}

}  // namespace replayssm
