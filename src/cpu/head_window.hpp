// One head's window of tokens on the CPU: where each token's x is and how much it weighs.
#pragma once

#include <cstdint>

namespace replayssm::cpu {

constexpr int64_t kMaxTokens = 64;  // history plus the current token, at most L

// weight[j] = dt_j exp(A sum_{i>j} dt_i) scales token j and checkpoint_decay = exp(A sum_i dt_i)
// scales the checkpoint (backward sums: no cancellation).
struct HeadWindow {
  const void* x[kMaxTokens];  // (P) act each
  float weight[kMaxTokens];
  float checkpoint_decay = 1.f;

  // From the raw dt of `count` tokens (fast_math.cpp: its exp and log1p run as vectors).
  void weigh(int64_t count, const float* raw_dt, float A, float bias, bool dt_softplus);
};

// v[i] = silu(v[i]) for i < n (fast_math.cpp: its exp runs as vectors).
void silu_in_place(float* v, int64_t n);

}  // namespace replayssm::cpu
