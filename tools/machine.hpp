// What a benchmark records about the machine and the moment it ran.
#pragma once

#include <cstdint>
#include <string>

namespace replayssm::tool {

struct MachineInfo {
  std::string cpu_model;
  int hardware_threads = 0;
  int backend_threads = 0;     // threads the CPU backend runs on
  int64_t last_level_cache_bytes = 0;
  int64_t memory_bytes = 0;
  bool built_with_cuda = false;
  int cuda_devices = 0;
  std::string compiler;
};

MachineInfo machine_info();

// The CPU backend's thread count: REPLAYSSM_NUM_THREADS when set, else the hardware concurrency
// (the rule of src/cpu/thread_pool.hpp).
int backend_thread_count();

// Size of the largest CPU cache, 32 MiB when the system does not say.
int64_t last_level_cache_bytes();

// "2026-11-30T15:01:19Z"
std::string utc_timestamp();

}  // namespace replayssm::tool
