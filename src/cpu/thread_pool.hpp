// A fixed pool of worker threads for the CPU backend: one parallel loop at a time, no allocation
// per call. The number of threads is the hardware concurrency, or REPLAYSSM_NUM_THREADS.
#pragma once

#include <cstdint>

namespace replayssm::cpu {

// Runs body(context, begin, end) over [0, count) in chunks of `grain` items on all threads
// (the caller included) and returns when every item is done. Calls from inside a body, or from
// several threads at once, run serially on the calling thread.
using RangeBody = void (*)(const void* context, int64_t begin, int64_t end);
void parallel_for(int64_t count, int64_t grain, RangeBody body, const void* context);

int thread_count();

// Typed convenience: fn(begin, end) for a callable that outlives the call.
template <typename Fn> void parallel_for(int64_t count, int64_t grain, const Fn& fn) {
  parallel_for(
      count, grain,
      [](const void* ctx, int64_t b, int64_t e) { (*static_cast<const Fn*>(ctx))(b, e); }, &fn);
}

}  // namespace replayssm::cpu
