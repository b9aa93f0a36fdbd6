// ReplaySSM decode kernels with an int8 checkpoint, for every activation dtype.
#include "cuda/mamba2_launch.cuh"

REPLAYSSM_INSTANTIATE_REPLAY_LAUNCHERS(replayssm::Int8);
