// ReplaySSM decode kernels with an fp8 (e4m3) checkpoint, for every activation dtype.
#include "cuda/mamba2_launch.cuh"

REPLAYSSM_INSTANTIATE_REPLAY_LAUNCHERS(replayssm::Float8E4M3);
