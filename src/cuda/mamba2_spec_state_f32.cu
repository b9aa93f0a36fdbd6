// Speculative kernels with an fp32 state, for every activation dtype.
#include "cuda/mamba2_spec_kernels.cuh"

REPLAYSSM_INSTANTIATE_SPEC_LAUNCHERS(float)
