// Decode kernels with a bf16 state, for every activation dtype.
#include "cuda/mamba2_launch.cuh"

REPLAYSSM_INSTANTIATE_LAUNCHERS(replayssm::BFloat16);
