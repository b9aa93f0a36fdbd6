#include "machine.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>
#include <thread>

#include "replayssm/runtime.hpp"

namespace replayssm::tool {
namespace {

std::string read_cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
  }
  return "unknown";
}

}  // namespace

int backend_thread_count() {
  int threads = int(std::thread::hardware_concurrency());
  if (const char* env = std::getenv("REPLAYSSM_NUM_THREADS")) threads = std::atoi(env);
  return std::max(threads, 1);
}

int64_t last_level_cache_bytes() {
  // The C library and the kernel may disagree (a virtual machine may see one slice of a shared
  // cache): take the larger, so that the benchmark's working set errs on the cold side.
  int64_t bytes = 0;
  for (const int name : {_SC_LEVEL1_DCACHE_SIZE, _SC_LEVEL2_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE,
                         _SC_LEVEL4_CACHE_SIZE})
    bytes = std::max<int64_t>(bytes, sysconf(name));
  for (int index = 0; index < 8; ++index) {
    std::ifstream size_file("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
    int64_t kib = 0;
    if (size_file >> kib) bytes = std::max(bytes, kib << 10);  // written as "32768K"
  }
  return bytes > 0 ? bytes : int64_t(32) << 20;
}

MachineInfo machine_info() {
  MachineInfo m;
  m.cpu_model = read_cpu_model();
  m.hardware_threads = int(std::thread::hardware_concurrency());
  m.backend_threads = backend_thread_count();
  m.last_level_cache_bytes = last_level_cache_bytes();
  m.memory_bytes = int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGESIZE));
  m.built_with_cuda = built_with_cuda();
  m.cuda_devices = cuda_device_count();
#if defined(__clang__)
  m.compiler = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  m.compiler = std::string("gcc ") + __VERSION__;
#else
  m.compiler = "unknown";
#endif
  return m;
}

std::string utc_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

}  // namespace replayssm::tool
