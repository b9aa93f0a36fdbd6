// Decode kernels with an fp32 state, for every activation dtype.
#include "cuda/mamba2_launch.cuh"

REPLAYSSM_INSTANTIATE_LAUNCHERS(float);
