#include "reference/mamba2_reference.hpp"

#include <cmath>
#include <cstring>
#include <vector>

#include "common/mamba2_math.hpp"

namespace replayssm::reference {
namespace {

void store_double(void* data, DType t, int64_t i, double v) {
  switch (t) {
    case DType::kFloat16: static_cast<uint16_t*>(data)[i] = float_to_fp16(float(v)); break;
    case DType::kBFloat16: static_cast<uint16_t*>(data)[i] = float_to_bf16(float(v)); break;
    case DType::kFloat64: static_cast<double*>(data)[i] = v; break;
    default: static_cast<float*>(data)[i] = float(v); break;
  }
}

double head_scalar(const HeadScalar& s, int64_t h, double absent) {
  return s.data ? load_as<double>(s.data, s.dtype, h * s.stride) : absent;
}

// One head's token: the inputs of the recurrence S = exp(A dt) S + dt x B^T.
struct Token {
  const void* x;  // (P) act
  const void* B;  // (N) act
  double raw_dt;
};

// S (P, N) advanced by one token, in fp64.
void step(std::vector<double>& S, const Mamba2Params& p, const Token& t, double A, double bias) {
  const double dt = effective_dt(t.raw_dt, bias, p.dt_softplus);
  const double decay = std::exp(A * dt);
  for (int64_t i = 0; i < p.head_dim; ++i) {
    const double xdt = load_as<double>(t.x, p.act_dtype, i) * dt;
    for (int64_t n = 0; n < p.state_dim; ++n)
      S[i * p.state_dim + n] = decay * S[i * p.state_dim + n] + xdt * load_as<double>(t.B, p.act_dtype, n);
  }
}

// out = (S C + D x) * silu(z), rounded to the activation dtype.
void write_output(const std::vector<double>& S, const Mamba2Params& p, int64_t row, int64_t h) {
  const int64_t g = h / p.heads_per_group;
  const void* C = static_cast<const char*>(p.C) +
                  (row * p.C_stride_batch + g * p.C_stride_group) * dtype_size(p.act_dtype);
  const int64_t x_off = row * p.x_stride_batch + h * p.x_stride_head;
  const int64_t z_off = row * p.z_stride_batch + h * p.z_stride_head;
  const int64_t out_off = row * p.out_stride_batch + h * p.out_stride_head;
  const double D = head_scalar(p.D, h, 0.0);
  for (int64_t i = 0; i < p.head_dim; ++i) {
    double y = 0;
    for (int64_t n = 0; n < p.state_dim; ++n) y += S[i * p.state_dim + n] * load_as<double>(C, p.act_dtype, n);
    y += D * load_as<double>(p.x, p.act_dtype, x_off + i);
    if (p.z) y *= silu(load_as<double>(p.z, p.act_dtype, z_off + i));
    store_double(p.out, p.act_dtype, out_off + i, y);
  }
}

const void* element(const void* base, DType t, int64_t offset) {
  return static_cast<const char*>(base) + offset * dtype_size(t);
}

Token current_token(const Mamba2Params& p, int64_t row, int64_t h) {
  const int64_t g = h / p.heads_per_group;
  return Token{element(p.x, p.act_dtype, row * p.x_stride_batch + h * p.x_stride_head),
               element(p.B, p.act_dtype, row * p.B_stride_batch + g * p.B_stride_group),
               load_as<double>(p.dt, p.dt_dtype, row * p.dt_stride_batch + h * p.dt_stride_head)};
}

// `scale` (slots, H, P): the 8-bit checkpoints' scales, else nullptr.
void load_state(std::vector<double>& S, const Mamba2Params& p, int64_t slot, int64_t h,
                const float* scale = nullptr, int64_t scale_stride_slot = 0, int64_t scale_stride_head = 0) {
  for (int64_t i = 0; i < p.head_dim; ++i) {
    const double row_scale = scale ? scale[slot * scale_stride_slot + h * scale_stride_head + i] : 1.0;
    for (int64_t n = 0; n < p.state_dim; ++n)
      S[i * p.state_dim + n] = row_scale * load_as<double>(
          p.state, p.state_dtype,
          slot * p.state_stride_slot + h * p.state_stride_head + i * p.state_stride_p + n);
  }
}

void store_state(const std::vector<double>& S, const Mamba2Params& p, int64_t slot, int64_t h) {
  for (int64_t i = 0; i < p.head_dim; ++i)
    for (int64_t n = 0; n < p.state_dim; ++n)
      store_double(p.state, p.state_dtype,
                   slot * p.state_stride_slot + h * p.state_stride_head + i * p.state_stride_p + n,
                   S[i * p.state_dim + n]);
}

// A flushed head of the checkpoint with stochastic rounding or an 8-bit format: the fp64 state
// rounded to fp32, then to the checkpoint by the shared rules of common/rounding.hpp.
template <typename S>
void store_rounded_checkpoint(const std::vector<double>& S_exact, const ReplayParams& p, int64_t slot,
                              int64_t h, FlushRandomBits& random) {
  std::vector<float> row(size_t(p.state_dim));
  for (int64_t i = 0; i < p.head_dim; ++i) {
    for (int64_t n = 0; n < p.state_dim; ++n) row[n] = float(S_exact[i * p.state_dim + n]);
    S* stored = static_cast<S*>(p.state) + slot * p.state_stride_slot + h * p.state_stride_head + i * p.state_stride_p;
    float* scale = p.state_scale ? p.state_scale + slot * p.scale_stride_slot + h * p.scale_stride_head + i : nullptr;
    round_checkpoint_row(row.data(), p.state_dim, stored, scale, p.stochastic_rounding, random,
                         uint32_t((h * p.head_dim + i) * p.state_dim));
  }
}

void store_checkpoint(const std::vector<double>& S, const ReplayParams& p, int64_t slot, int64_t h,
                      FlushRandomBits& random) {
  switch (p.state_dtype) {
    case DType::kInt8: return store_rounded_checkpoint<Int8>(S, p, slot, h, random);
    case DType::kFloat8E4M3: return store_rounded_checkpoint<Float8E4M3>(S, p, slot, h, random);
    case DType::kFloat16:
      if (p.stochastic_rounding) return store_rounded_checkpoint<Half>(S, p, slot, h, random);
      break;
    case DType::kBFloat16:
      if (p.stochastic_rounding) return store_rounded_checkpoint<BFloat16>(S, p, slot, h, random);
      break;
    default: break;
  }
  store_state(S, p, slot, h);
}

void copy_elements(void* dst, const void* src, DType t, int64_t count) {
  std::memcpy(dst, src, size_t(count * dtype_size(t)));
}

}  // namespace

void selective_state_update(const Mamba2Params& p) {
  std::vector<double> S(size_t(p.head_dim * p.state_dim));
  for (int64_t row = 0; row < p.batch; ++row) {
    const int64_t slot = slot_of_row(p, row);
    if (slot < 0) continue;
    for (int64_t h = 0; h < p.nheads; ++h) {
      load_state(S, p, slot, h);
      step(S, p, current_token(p, row, h), head_scalar(p.A, h, 0.0), head_scalar(p.dt_bias, h, 0.0));
      store_state(S, p, slot, h);
      write_output(S, p, row, h);
    }
  }
}

void replay_decode(const ReplayParams& p) {
  std::vector<double> S(size_t(p.head_dim * p.state_dim));
  const int64_t act = dtype_size(p.act_dtype);
  for (int64_t row = 0; row < p.batch; ++row) {
    const int64_t slot = slot_of_row(p, row);
    if (slot < 0) continue;
    const int64_t fill = p.cursors[slot * p.cursors_stride];
    const bool flush = fill == p.buffer_len - 1;
    FlushRandomBits random = flush_random_bits(p, slot);
    for (int64_t h = 0; h < p.nheads; ++h) {
      const int64_t g = h / p.heads_per_group;
      const double A = head_scalar(p.A, h, 0.0), bias = head_scalar(p.dt_bias, h, 0.0);
      char* x_hist = static_cast<char*>(p.x_cache) + (slot * p.xc_stride_slot + h * p.xc_stride_head) * act;
      char* B_hist = static_cast<char*>(p.B_cache) + (slot * p.Bc_stride_slot + g * p.Bc_stride_group) * act;
      float* dt_hist = p.dt_cache + slot * p.dtc_stride_slot + h * p.dtc_stride_head;

      load_state(S, p, slot, h, p.state_scale, p.scale_stride_slot, p.scale_stride_head);
      for (int64_t j = 0; j < fill; ++j)
        step(S, p, Token{x_hist + j * p.xc_stride_pos * act, B_hist + j * p.Bc_stride_pos * act, dt_hist[j]},
             A, bias);
      const Token now = current_token(p, row, h);
      step(S, p, now, A, bias);
      write_output(S, p, row, h);

      if (flush) {
        store_checkpoint(S, p, slot, h, random);
      } else {
        copy_elements(x_hist + fill * p.xc_stride_pos * act, now.x, p.act_dtype, p.head_dim);
        if (h % p.heads_per_group == 0)
          copy_elements(B_hist + fill * p.Bc_stride_pos * act, now.B, p.act_dtype, p.state_dim);
        dt_hist[fill] = float(now.raw_dt);
      }
    }
    if (flush) count_flush(p, slot);
  }
}

void spec_verify(const SpecVerifyParams& p) {
  std::vector<double> S(size_t(p.head_dim * p.state_dim));
  const int64_t act = dtype_size(p.act_dtype);
  const int64_t mask = p.ring_len - 1;
  for (int64_t row = 0; row < p.batch; ++row) {
    const int64_t slot = slot_of_row(p, row);
    if (slot < 0) continue;
    const int32_t* ring = p.ring + slot * p.ring_stride_slot;
    const int64_t origin = ring[0], committed = ring[p.ring_stride_field];
    const bool flush = spec_flushes(committed, p.window, p.buffer_len);
    for (int64_t h = 0; h < p.nheads; ++h) {
      const int64_t g = h / p.heads_per_group;
      const double A = head_scalar(p.A, h, 0.0), bias = head_scalar(p.dt_bias, h, 0.0);
      char* x_ring = static_cast<char*>(p.x_cache) + (slot * p.xc_stride_slot + h * p.xc_stride_head) * act;
      char* B_ring = static_cast<char*>(p.B_cache) + (slot * p.Bc_stride_slot + g * p.Bc_stride_group) * act;
      float* dt_ring = p.dt_cache + slot * p.dtc_stride_slot + h * p.dtc_stride_head;

      load_state(S, p, slot, h);
      for (int64_t j = 0; j < committed; ++j) {
        const int64_t pos = (origin + j) & mask;
        step(S, p, Token{x_ring + pos * p.xc_stride_pos * act, B_ring + pos * p.Bc_stride_pos * act, dt_ring[pos]},
             A, bias);
      }
      if (flush) store_state(S, p, slot, h);
      for (int64_t t = 0; t < valid_tokens(p, row); ++t) {
        const Mamba2Params position = window_position(p, t);
        const Token now = current_token(position, row, h);
        step(S, position, now, A, bias);
        write_output(S, position, row, h);
        const int64_t pos = (origin + committed + t) & mask;
        copy_elements(x_ring + pos * p.xc_stride_pos * act, now.x, p.act_dtype, p.head_dim);
        if (h % p.heads_per_group == 0)
          copy_elements(B_ring + pos * p.Bc_stride_pos * act, now.B, p.act_dtype, p.state_dim);
        dt_ring[pos] = float(now.raw_dt);
      }
    }
  }
}

void spec_state_update(const SpecBaselineParams& p) {
  std::vector<double> S(size_t(p.head_dim * p.state_dim));
  for (int64_t row = 0; row < p.batch; ++row) {
    if (slot_of_row(p, row) < 0) continue;
    const int64_t source = baseline_slot(p, row, p.num_accepted_tokens[row * p.num_accepted_tokens_stride] - 1);
    for (int64_t h = 0; h < p.nheads; ++h) {
      const double A = head_scalar(p.A, h, 0.0), bias = head_scalar(p.dt_bias, h, 0.0);
      load_state(S, p, source, h);
      for (int64_t t = 0; t < valid_tokens(p, row); ++t) {
        const Mamba2Params position = window_position(p, t);
        step(S, position, current_token(position, row, h), A, bias);
        store_state(S, position, baseline_slot(p, row, t), h);
        write_output(S, position, row, h);
      }
    }
  }
}

}  // namespace replayssm::reference
