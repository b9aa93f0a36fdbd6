// The building blocks of the CPU kernels, shared by standard decode (mamba2_cpu.cpp) and
// speculative decoding (mamba2_spec_cpu.cpp): fp32 vectors, the windows of tokens a head replays,
// and the register-tiled state and output arithmetic. Every file that includes this one is compiled
// with the same target options (CMakeLists.txt), so the vector types agree.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "api/params.hpp"
#include "common/mamba2_math.hpp"
#include "cpu/head_window.hpp"
#include "cpu/thread_pool.hpp"

namespace replayssm::cpu {

// Register tiles of the state-and-output route: kRows state rows x kTile columns, in vectors of
// kLanes floats (GCC/Clang vector extensions: AVX registers where the target has them).
constexpr int kLanes = 8;
constexpr int kTileVecs = 2;
constexpr int64_t kTile = kLanes * kTileVecs;
// Rows of a register tile: one token (the baseline) is bound by memory, 4 rows keep 4 streams in
// flight; a window of tokens (a flush) is bound by its FMAs, 6 rows x kTileVecs give 12 independent
// accumulators (with the B vectors and a broadcast, 15 of the 16 AVX2 registers).
constexpr int kRows = 4;
constexpr int kWindowRows = 6;
constexpr int kReadHeads = 8;  // heads whose checkpoints the output-only route reads at once
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));

inline Vec load_vec(const float* src) {
  Vec v;
  std::memcpy(&v, src, sizeof(v));
  return v;
}

inline float horizontal_sum(Vec v) {
  float sum = 0.f;
  for (int l = 0; l < kLanes; ++l) sum += v[l];
  return sum;
}

typedef uint32_t Bits __attribute__((vector_size(kLanes * sizeof(uint32_t))));
typedef uint16_t Bits16 __attribute__((vector_size(kLanes * sizeof(uint16_t))));

// kLanes consecutive elements widened to fp32, as whole vectors where the format allows it
// (a per-lane loop through memory does not compile to vector loads).
inline Vec widen_vec(const float* src) { return load_vec(src); }

inline Vec widen_vec(const BFloat16* src) {
  Bits16 half;
  std::memcpy(&half, src, sizeof(half));
  const Bits bits = __builtin_convertvector(half, Bits) << 16;
  Vec v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

// fp16 and the 8-bit formats, lane by lane.
template <typename S> Vec widen_vec(const S* src) {
  float lanes[kLanes];
  for (int l = 0; l < kLanes; ++l) lanes[l] = to_float(src[l]);
  return load_vec(lanes);
}

// The same rounding as from_float<S>, kLanes at a time.
inline void narrow_vec(Vec v, float* dst) { std::memcpy(dst, &v, sizeof(v)); }

inline void narrow_vec(Vec v, BFloat16* dst) {
  Bits u;
  std::memcpy(&u, &v, sizeof(u));
  const Bits nan = (u & 0x7fffffffu) > 0x7f800000u;  // all ones where NaN
  const Bits rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const Bits16 out = __builtin_convertvector((nan & ((u >> 16) | 0x40u)) | (~nan & rounded), Bits16);
  std::memcpy(dst, &out, sizeof(out));
}

template <typename S> void narrow_vec(Vec v, S* dst) {
  for (int l = 0; l < kLanes; ++l) dst[l] = from_float<S>(v[l]);
}

// A partial vector (the last tile of a state dim that is not a multiple of kLanes): past
// `valid`, zeros in and nothing out.
template <bool kFull, typename S> Vec load_widened(const S* src, int64_t valid) {
  if (kFull) return widen_vec(src);
  float lanes[kLanes];
  for (int l = 0; l < kLanes; ++l) lanes[l] = l < valid ? to_float(src[l]) : 0.f;
  return load_vec(lanes);
}

template <bool kFull, typename S> void store_narrowed(Vec v, S* dst, int64_t valid) {
  if (kFull) return narrow_vec(v, dst);
  for (int l = 0; l < valid && l < kLanes; ++l) dst[l] = from_float<S>(v[l]);
}

template <typename T> const T* at(const void* base, int64_t offset) {
  return static_cast<const T*>(base) + offset;
}
template <typename T> T* at(void* base, int64_t offset) { return static_cast<T*>(base) + offset; }

template <typename T> void widen(const T* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Asks for `bytes` from `p` ahead of their use (software prefetch, into L2).
inline void prefetch(const void* p, int64_t bytes) {
  constexpr int64_t kLine = 64;
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += kLine) __builtin_prefetch(c + b, 0, 2);
}

inline float head_scalar(const HeadScalar& s, int64_t h, float absent) {
  return s.data ? load_as<float>(s.data, s.dtype, h * s.stride) : absent;
}

inline float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// Visits the rows [0, P) in blocks of R rows spaced P / R apart, then the leftover rows one by
// one: fn(std::integral_constant<int, rows>, first, stride). Rows far apart are R memory streams
// in flight at once; one stream per core falls well short of a CPU's memory bandwidth.
template <int R, typename Fn> void for_row_blocks(int64_t P, const Fn& fn) {
  const int64_t stride = P / R;
  for (int64_t i = 0; i < stride; ++i) fn(std::integral_constant<int, R>{}, i, stride);
  for (int64_t i = stride * R; i < P; ++i) fn(std::integral_constant<int, 1>{}, i, int64_t(1));
}

// Per-thread scratch, grown once and reused: no allocation in steady state.
inline float* scratch(int64_t floats) {
  thread_local std::vector<float> buffer;
  if (int64_t(buffer.size()) < floats) buffer.resize(size_t(floats));
  return buffer.data();
}

// What the heads of one (row, group) share: the `count` tokens since the checkpoint (cached ones,
// then the current one), their B widened to fp32 and zero padded to whole tiles, and C.
struct GroupWindow {
  int64_t count = 0;
  float* C = nullptr;   // (n_pad)
  float* Bf = nullptr;  // (count, n_pad)
  float bc[kMaxTokens];  // B_j . C, for the output-only route
};

template <typename S, typename Act> class HeadKernel {
 public:
  HeadKernel(const Mamba2Params& p, int64_t max_tokens)
      : p_(p), n_pad_(round_up(p.state_dim, kTile)), max_tokens_(max_tokens) {}

  // C (n_pad), Bf (max_tokens, n_pad), y (P), a (max_tokens, P), dots (heads per group, P),
  // staged (P, n_pad).
  int64_t scratch_floats() const {
    return (1 + max_tokens_) * n_pad_ + (1 + max_tokens_ + p_.heads_per_group) * p_.head_dim +
           p_.head_dim * n_pad_;
  }

  // C of (row, group g), widened into `work` (the group window's scratch).
  void load_C(GroupWindow& gw, int64_t row, int64_t g, float* work) const {
    const int64_t N = p_.state_dim;
    gw.C = work;
    widen(at<Act>(p_.C, row * p_.C_stride_batch + g * p_.C_stride_group), gw.C, N);
    std::fill(gw.C + N, gw.C + n_pad_, 0.f);
  }

  // The window's B_j (at B[j], j < count), widened after C (load_C), and B_j . C when with_bc.
  void load_tokens(GroupWindow& gw, const void* const* B, bool with_bc) const {
    const int64_t N = p_.state_dim;
    gw.Bf = gw.C + n_pad_;
    for (int64_t j = 0; j < gw.count; ++j) {
      float* b = gw.Bf + j * n_pad_;
      widen(static_cast<const Act*>(B[j]), b, N);
      std::fill(b + N, b + n_pad_, 0.f);
      if (with_bc) gw.bc[j] = dot(b, gw.C, N);
    }
  }

  int64_t padded_state_dim() const { return n_pad_; }
  float* y_of(float* work) const { return work + (1 + max_tokens_) * n_pad_; }
  float* a_of(float* work) const { return y_of(work) + p_.head_dim; }
  float* dots_of(float* work) const { return a_of(work) + max_tokens_ * p_.head_dim; }
  float* staged_of(float* work) const { return dots_of(work) + p_.heads_per_group * p_.head_dim; }

  // State-and-output: S = decay S0 + sum_j (weight_j x_j) B_j^T in register tiles, y = S C. S0 is
  // read from `from`, with row scales `scale` (P) for an 8-bit checkpoint (else nullptr). S is
  // stored unless `to` is null (a flush or the baseline: `to` == `from`; the speculative baseline:
  // the slot of the next window position): rounded to S in place, or, when `staged` (P, n_pad) is
  // given, kept in fp32 there for round_checkpoint_row.
  void state_and_output(const GroupWindow& gw, const HeadWindow& hw, const S* from,
                        const float* scale, S* to, float* staged, float* y, float* a) const {
    const int64_t P = p_.head_dim;
    for (int64_t j = 0; j < gw.count; ++j) {
      const Act* x = static_cast<const Act*>(hw.x[j]);
      for (int64_t i = 0; i < P; ++i) a[j * P + i] = hw.weight[j] * to_float(x[i]);
    }
    auto visit = [&](auto block, int64_t first, int64_t stride) {
      rows<decltype(block)::value>(gw, hw, from, scale, to, staged, a, first, stride, y);
    };
    if (gw.count == 1)
      for_row_blocks<kRows>(P, visit);
    else
      for_row_blocks<kWindowRows>(P, visit);
  }

  // dots (heads, P) = S0_h C for `heads` consecutive heads of one group (they share C). Heads are
  // read kReadHeads at a time, each row after row: long sequential streams, several in flight.
  // `scale` (heads, P) with head stride `scale_stride`: an 8-bit checkpoint's row scales, else
  // nullptr.
  void checkpoint_dots(const S* state, const float* scale, int64_t scale_stride, int64_t heads,
                       const float* C, float* dots) const {
    int64_t h = 0;
    for (; h + kReadHeads <= heads; h += kReadHeads) heads_dot_C<kReadHeads>(state, h, C, dots);
    for (; h < heads; ++h) heads_dot_C<1>(state, h, C, dots);
    if (scale)
      for (h = 0; h < heads; ++h)
        for (int64_t i = 0; i < p_.head_dim; ++i) dots[h * p_.head_dim + i] *= scale[h * scale_stride + i];
  }

  // Output-only: y = decay (S0 C) + sum_j weight_j (B_j . C) x_j, from the head's S0 C.
  void output_only(const GroupWindow& gw, const HeadWindow& hw, const float* dots, float* y) const {
    const int64_t P = p_.head_dim;
    for (int64_t i = 0; i < P; ++i) y[i] = hw.checkpoint_decay * dots[i];
    for (int64_t j = 0; j < gw.count; ++j) {
      const float coef = hw.weight[j] * gw.bc[j];
      const Act* x = static_cast<const Act*>(hw.x[j]);
#pragma omp simd
      for (int64_t k = 0; k < P; ++k) y[k] += coef * to_float(x[k]);
    }
  }

  // out = (y + D x) * silu(z), kLanes rows at a time, the gates of up to kGateRows rows a call
  // (their exp as vector calls: silu_in_place).
  void finish(const float* y, int64_t row, int64_t h) const {
    constexpr int64_t kGateRows = 64;
    const Act* x = at<Act>(p_.x, row * p_.x_stride_batch + h * p_.x_stride_head);
    Act* out = at<Act>(p_.out, row * p_.out_stride_batch + h * p_.out_stride_head);
    const float D = head_scalar(p_.D, h, 0.f);
    const Act* z = p_.z ? at<Act>(p_.z, row * p_.z_stride_batch + h * p_.z_stride_head) : nullptr;
    float gate[kGateRows];
    for (int64_t i0 = 0; i0 < p_.head_dim; i0 += kGateRows) {
      const int64_t n = std::min(kGateRows, p_.head_dim - i0);
      if (z) {
        widen(z + i0, gate, n);
        silu_in_place(gate, n);
      } else {
        std::fill(gate, gate + n, 1.f);
      }
      int64_t i = 0;
      for (; i + kLanes <= n; i += kLanes)
        narrow_vec((load_vec(y + i0 + i) + D * widen_vec(x + i0 + i)) * load_vec(gate + i), out + i0 + i);
      for (; i < n; ++i) out[i0 + i] = from_float<Act>((y[i0 + i] + D * to_float(x[i0 + i])) * gate[i]);
    }
  }

 private:
  // dots[h0 + r][i] = S0_{h0 + r}[i, :] . C for r < R, every row i.
  template <int R> void heads_dot_C(const S* state, int64_t h0, const float* C, float* dots) const {
    const int64_t N = p_.state_dim;
    for (int64_t i = 0; i < p_.head_dim; ++i) {
      Vec acc[R] = {};
      const S* row = state + h0 * p_.state_stride_head + i * p_.state_stride_p;
      int64_t n0 = 0;
      for (; n0 + kLanes <= N; n0 += kLanes) {
        const Vec c = load_vec(C + n0);
        for (int r = 0; r < R; ++r) acc[r] += widen_vec(row + r * p_.state_stride_head + n0) * c;
      }
      if (n0 < N) {
        const Vec c = load_vec(C + n0);
        for (int r = 0; r < R; ++r)
          acc[r] += load_widened<false>(row + r * p_.state_stride_head + n0, N - n0) * c;
      }
      for (int r = 0; r < R; ++r) dots[(h0 + r) * p_.head_dim + i] = horizontal_sum(acc[r]);
    }
  }

  // Rows i0 + r * stride (r < R) of the state, tile by tile.
  template <int R>
  void rows(const GroupWindow& gw, const HeadWindow& hw, const S* from, const float* scale, S* to,
            float* staged, const float* a, int64_t i0, int64_t stride, float* y) const {
    Vec y_part[R][kTileVecs] = {};
    float decay[R];  // of each row's stored values: the checkpoint's decay times the row's scale
    for (int r = 0; r < R; ++r) decay[r] = hw.checkpoint_decay * (scale ? scale[i0 + r * stride] : 1.f);
    for (int64_t n0 = 0; n0 < p_.state_dim; n0 += kTile) {
      if (n0 + kTile <= p_.state_dim)
        tile<R, true>(gw, decay, from, to, staged, a, i0, stride, n0, y_part);
      else
        tile<R, false>(gw, decay, from, to, staged, a, i0, stride, n0, y_part);
    }
    for (int r = 0; r < R; ++r) {
      Vec sum = {};
      for (int v = 0; v < kTileVecs; ++v) sum += y_part[r][v];
      y[i0 + r * stride] = horizontal_sum(sum);
    }
  }

  template <int R, bool kFullTile>
  void tile(const GroupWindow& gw, const float (&decay)[R], const S* from, S* to, float* staged,
            const float* a, int64_t i0, int64_t stride, int64_t n0, Vec (&y_part)[R][kTileVecs]) const {
    const int64_t P = p_.head_dim;
    const int64_t width = kFullTile ? kTile : p_.state_dim - n0;
    Vec acc[R][kTileVecs];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < kTileVecs; ++v)
        acc[r][v] = decay[r] *
                    load_widened<kFullTile>(from + (i0 + r * stride) * p_.state_stride_p + n0 + v * kLanes,
                                            width - v * kLanes);
    for (int64_t j = 0; j < gw.count; ++j) {
      const float* b = gw.Bf + j * n_pad_ + n0;
      Vec bv[kTileVecs];
      for (int v = 0; v < kTileVecs; ++v) bv[v] = load_vec(b + v * kLanes);
      for (int r = 0; r < R; ++r) {
        const float ar = a[j * P + i0 + r * stride];
        for (int v = 0; v < kTileVecs; ++v) acc[r][v] += ar * bv[v];
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < kTileVecs; ++v) y_part[r][v] += acc[r][v] * load_vec(gw.C + n0 + v * kLanes);
    if (to && staged)
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < kTileVecs; ++v)
          store_narrowed<true>(acc[r][v], staged + (i0 + r * stride) * n_pad_ + n0 + v * kLanes, kLanes);
    else if (to)
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < kTileVecs; ++v)
          store_narrowed<kFullTile>(acc[r][v], to + (i0 + r * stride) * p_.state_stride_p + n0 + v * kLanes,
                                    width - v * kLanes);
  }

  const Mamba2Params& p_;
  int64_t n_pad_;
  int64_t max_tokens_;
};

// Heads of one group handled by one work item: whole groups when the batch gives every thread
// enough items, smaller chunks at small batch.
inline int64_t heads_per_item(const Mamba2Params& p) {
  int64_t chunk = p.heads_per_group;
  const int64_t wanted = 8 * int64_t(thread_count());
  while (chunk > 1 && p.batch * p.ngroups * ((p.heads_per_group + chunk - 1) / chunk) < wanted)
    chunk = (chunk + 1) / 2;
  return chunk;
}

}  // namespace replayssm::cpu
