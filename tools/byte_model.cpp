#include "byte_model.hpp"

#include <algorithm>

namespace replayssm::tool {

// Per (row, head), with s / a the state / activation element sizes and r heads per group:
//   baseline  2 P N s + 2 P a + 2 N a / r
//   replay    P N s (1 + 1/L) + [(L-1)/2 + (L-1)/L] (P a + 4 + N a / r) + 2 P a + 2 N a / r
// The replay history term: on average (L-1)/2 cached tokens are read and (L-1)/L are appended,
// each of P activations, one fp32 dt, and its share N a / r of the group's B. An 8-bit state also
// moves its fp32 scale per row of P with it: P N s becomes P N s + 4 P.

namespace {

double state_bytes_per_head(const Geometry& g, DType state) {
  const double P = double(g.head_dim), N = double(g.state_dim);
  return P * N * double(dtype_size(state)) + (is_scaled_checkpoint(state) ? 4 * P : 0);
}

}  // namespace

double baseline_bytes_per_step(const Geometry& g, int64_t batch, DType state, DType act) {
  const double P = double(g.head_dim), N = double(g.state_dim), r = double(g.heads_per_group());
  const double a = double(dtype_size(act));
  const double per_head = 2 * state_bytes_per_head(g, state) + 2 * P * a + 2 * N * a / r;
  return per_head * double(batch) * double(g.heads);
}

double replay_bytes_per_step(const Geometry& g, int64_t batch, int64_t buffer_len, DType state,
                             DType act) {
  const double P = double(g.head_dim), N = double(g.state_dim), r = double(g.heads_per_group());
  const double a = double(dtype_size(act));
  const double L = double(buffer_len);
  const double history_tokens = (L - 1) / 2 + (L - 1) / L;
  const double per_head = state_bytes_per_head(g, state) * (1 + 1 / L) + history_tokens * (P * a + 4 + N * a / r) +
                          2 * P * a + 2 * N * a / r;
  return per_head * double(batch) * double(g.heads);
}

// Speculative, per (row, head) and verify step of T tokens, f flushes and w committed inputs:
//   baseline spec  (1 + T) P N s + 2 T P a + 2 T N a / r
//   replay spec    (1 + f) P N s + (w + T)(P a + 4) + 3 T P a + (3T + 2w) N a / r

double baseline_spec_bytes_per_step(const Geometry& g, int64_t batch, int64_t window, DType state,
                                    DType act) {
  const double P = double(g.head_dim), N = double(g.state_dim), r = double(g.heads_per_group());
  const double s = double(dtype_size(state)), a = double(dtype_size(act)), T = double(window);
  const double per_head = (1 + T) * P * N * s + 2 * T * P * a + 2 * T * N * a / r;
  return per_head * double(batch) * double(g.heads);
}

double replay_spec_bytes_per_step(const Geometry& g, int64_t batch, int64_t window, double flushes,
                                  double history, DType state, DType act) {
  const double P = double(g.head_dim), N = double(g.state_dim), r = double(g.heads_per_group());
  const double s = double(dtype_size(state)), a = double(dtype_size(act)), T = double(window);
  const double f = flushes, w = history;
  const double per_head = (1 + f) * P * N * s + (w + T) * (P * a + 4) + 3 * T * P * a +
                          (3 * T + 2 * w) * N * a / r;
  return per_head * double(batch) * double(g.heads);
}

double standard_slot_bytes(const Geometry& g, DType state) {
  return double(g.heads * g.head_dim * g.state_dim * dtype_size(state));
}

double baseline_spec_slot_bytes(const Geometry& g, int64_t window, DType state) {
  return double(window) * standard_slot_bytes(g, state);
}

double replay_spec_slot_bytes(const Geometry& g, int64_t ring_len, DType state, DType act) {
  return standard_slot_bytes(g, state) + history_slot_bytes(g, ring_len, act);
}

double history_slot_bytes(const Geometry& g, int64_t positions, DType act) {
  const double a = double(dtype_size(act));
  return double(positions) * (double(g.heads) * (double(g.head_dim) * a + 4) + double(g.groups * g.state_dim) * a);
}

namespace {
constexpr int64_t kL2Multiple = 2;
constexpr int64_t kMinRotatedBytes = int64_t(256) << 20;
}  // namespace

int64_t cold_state_bytes(int64_t l2_bytes) { return std::max(kL2Multiple * l2_bytes, kMinRotatedBytes); }

int64_t cold_layer_copies(int64_t l2_bytes, int64_t layer_state_bytes, int64_t layer_history_bytes) {
  auto copies = [](int64_t target, int64_t bytes) { return (target + bytes - 1) / bytes; };
  return std::max<int64_t>({1, copies(cold_state_bytes(l2_bytes), layer_state_bytes),
                            copies(kL2Multiple * l2_bytes, layer_history_bytes)});
}

}  // namespace replayssm::tool
