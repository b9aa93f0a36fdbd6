// The CPU kernels' transcendental loops, in a file of their own: compiled with -ffast-math
// (CMakeLists.txt) so that their exp and log1p become vector calls (glibc's libmvec). A replayed
// window pays them for every token every step (HeadWindow::weigh), every path for every output
// (the gates, silu_in_place). Nothing else is compiled with that option.
#include <cmath>

#include "common/mamba2_math.hpp"
#include "cpu/head_window.hpp"

namespace replayssm::cpu {
namespace {

// Windows of more than a couple of tokens run in whole vectors (zero-padded to kPadTokens).
constexpr int64_t kPadTokens = 8;
constexpr int64_t kScalarTokens = 2;

}  // namespace

void HeadWindow::weigh(int64_t count, const float* raw_dt, float A, float bias, bool dt_softplus) {
  const int64_t n = count <= kScalarTokens ? count : (count + kPadTokens - 1) / kPadTokens * kPadTokens;
  float raw[kMaxTokens], dt[kMaxTokens], later[kMaxTokens];
  for (int64_t j = 0; j < n; ++j) raw[j] = j < count ? raw_dt[j] : 0.f;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) dt[j] = effective_dt(raw[j], bias, dt_softplus);
  float sum = 0.f;  // of the effective dt of the tokens after j
  for (int64_t j = n - 1; j >= 0; --j) {
    later[j] = sum;
    if (j < count) sum += dt[j];
  }
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) weight[j] = dt[j] * std::exp(A * later[j]);
  checkpoint_decay = std::exp(A * sum);
}

void silu_in_place(float* v, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) v[i] = silu(v[i]);
}

}  // namespace replayssm::cpu
