// The scalar pieces of Mamba-2 math shared by every backend (host and device).
#pragma once

#include <cmath>

#include "replayssm/dtype.hpp"

namespace replayssm {

// mamba-ssm's softplus: identity above 20.
template <typename T> REPLAYSSM_HOST_DEVICE T softplus(T v) {
  using std::exp;
  using std::log1p;
  return v <= T(20) ? log1p(exp(v)) : v;
}

template <typename T> REPLAYSSM_HOST_DEVICE T silu(T v) {
  using std::exp;
  return v / (T(1) + exp(-v));
}

// The effective dt of a token from its raw value: + dt_bias, then softplus if asked for.
template <typename T> REPLAYSSM_HOST_DEVICE T effective_dt(T raw_dt, T bias, bool dt_softplus) {
  const T v = raw_dt + bias;
  return dt_softplus ? softplus(v) : v;
}

// Reads element i of a tensor of runtime dtype `t` (fp32, fp16, bf16, fp64, or the stored value
// of an 8-bit checkpoint, before its scale) as T.
template <typename T> REPLAYSSM_HOST_DEVICE T load_as(const void* data, DType t, int64_t i) {
  switch (t) {
    case DType::kInt8: return T(static_cast<const int8_t*>(data)[i]);
    case DType::kFloat8E4M3: return T(e4m3_to_float(static_cast<const uint8_t*>(data)[i]));
    case DType::kFloat16: return T(fp16_to_float(static_cast<const uint16_t*>(data)[i]));
    case DType::kBFloat16: return T(bf16_to_float(static_cast<const uint16_t*>(data)[i]));
    case DType::kFloat64: return T(static_cast<const double*>(data)[i]);
    default: return T(static_cast<const float*>(data)[i]);
  }
}

}  // namespace replayssm
