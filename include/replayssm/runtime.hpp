// What this build and this machine offer.
#pragma once

namespace replayssm {

// True when the library was compiled with its CUDA sources (nvcc was found at build time).
bool built_with_cuda();

// Number of usable CUDA devices; 0 without CUDA, without a driver or without a GPU.
int cuda_device_count();

}  // namespace replayssm
