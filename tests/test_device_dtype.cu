// The device's conversions (one instruction each for fp16, bf16 and e4m3) give the host's values
// for every non-NaN input: CPU and CUDA checkpoints and outputs depend on it.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "replayssm/dtype.hpp"
#include "replayssm/runtime.hpp"

namespace replayssm {
namespace {

constexpr int kFp16Values = 1 << 16;
constexpr int kE4m3Values = 1 << 8;
constexpr int kProbes = 4;  // per 16-bit value: the value scaled up and down and the neighbouring midpoints

// The float inputs of a rounding probed around value v of a 16-bit format, next its successor
// (rounding ties included).
__host__ __device__ float probe(float v, float next, int k) {
  switch (k) {
    case 0: return v * 1.0009765625f;
    case 1: return v * 0.99951171875f;
    case 2: return 0.5f * (v + next);  // a tie (or an fp32 rounding of it)
    default: return v + 0.25f * (next - v);
  }
}

__host__ __device__ float fp16_probe(uint16_t h, int k) {
  return probe(fp16_to_float(h), fp16_to_float(uint16_t(h + 1)), k);
}
__host__ __device__ float bf16_probe(uint16_t h, int k) {
  return probe(bf16_to_float(h), bf16_to_float(uint16_t(h + 1)), k);
}

__global__ void convert_on_device(float* from_fp16, float* from_e4m3, uint16_t* to_fp16, uint16_t* to_bf16) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < kFp16Values) {
    from_fp16[i] = fp16_to_float(uint16_t(i));
    for (int k = 0; k < kProbes; ++k) {
      to_fp16[i * kProbes + k] = float_to_fp16(fp16_probe(uint16_t(i), k));
      to_bf16[i * kProbes + k] = float_to_bf16(bf16_probe(uint16_t(i), k));
    }
  }
  if (i < kE4m3Values) from_e4m3[i] = e4m3_to_float(uint8_t(i));
}

template <typename T> std::vector<T> to_host(const T* device, int count) {
  std::vector<T> host(static_cast<size_t>(count));
  EXPECT_EQ(cudaMemcpy(host.data(), device, sizeof(T) * count, cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

TEST(DeviceDtype, ConversionsMatchTheHostForEveryValue) {
  if (!built_with_cuda() || cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  float *from_fp16 = nullptr, *from_e4m3 = nullptr;
  uint16_t *to_fp16 = nullptr, *to_bf16 = nullptr;
  ASSERT_EQ(cudaMalloc(&from_fp16, sizeof(float) * kFp16Values), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&from_e4m3, sizeof(float) * kE4m3Values), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&to_fp16, sizeof(uint16_t) * kFp16Values * kProbes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&to_bf16, sizeof(uint16_t) * kFp16Values * kProbes), cudaSuccess);
  convert_on_device<<<kFp16Values / 256, 256>>>(from_fp16, from_e4m3, to_fp16, to_bf16);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> fp16 = to_host(from_fp16, kFp16Values), e4m3 = to_host(from_e4m3, kE4m3Values);
  const std::vector<uint16_t> rounded = to_host(to_fp16, kFp16Values * kProbes);
  const std::vector<uint16_t> rounded_bf16 = to_host(to_bf16, kFp16Values * kProbes);
  int checked = 0, checked_bf16 = 0;
  for (int i = 0; i < kFp16Values; ++i) {
    const float host = fp16_to_float(uint16_t(i));
    if (std::isnan(host)) {
      EXPECT_TRUE(std::isnan(fp16[size_t(i)])) << "fp16 bits " << i;
      continue;
    }
    EXPECT_EQ(float_bits(fp16[size_t(i)]), float_bits(host)) << "fp16 bits " << i;
    for (int k = 0; k < kProbes; ++k) {
      const float v = fp16_probe(uint16_t(i), k);
      if (std::isnan(v)) continue;
      EXPECT_EQ(rounded[size_t(i * kProbes + k)], float_to_fp16(v)) << "float " << v;
      ++checked;
    }
  }
  for (int i = 0; i < kFp16Values; ++i) {  // every bf16 value
    for (int k = 0; k < kProbes; ++k) {
      const float v = bf16_probe(uint16_t(i), k);
      if (std::isnan(v)) continue;
      EXPECT_EQ(rounded_bf16[size_t(i * kProbes + k)], float_to_bf16(v)) << "float " << v;
      ++checked_bf16;
    }
  }
  for (int i = 0; i < kE4m3Values; ++i) {
    const float host = e4m3_to_float(uint8_t(i));
    if (std::isnan(host)) {
      EXPECT_TRUE(std::isnan(e4m3[size_t(i)])) << "e4m3 bits " << i;
    } else {
      EXPECT_EQ(float_bits(e4m3[size_t(i)]), float_bits(host)) << "e4m3 bits " << i;
    }
  }
  EXPECT_GT(checked, kFp16Values * 3);  // every finite value probed
  EXPECT_GT(checked_bf16, kFp16Values * 3);
  cudaFree(from_fp16);
  cudaFree(from_e4m3);
  cudaFree(to_fp16);
  cudaFree(to_bf16);
}

}  // namespace
}  // namespace replayssm
