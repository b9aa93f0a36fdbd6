#include "cpu/thread_pool.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace replayssm::cpu {
namespace {

class ThreadPool {
 public:
  ThreadPool() {
    int n = int(std::thread::hardware_concurrency());
    if (const char* env = std::getenv("REPLAYSSM_NUM_THREADS")) n = std::atoi(env);
    n = std::max(n, 1);
    for (int i = 1; i < n; ++i) workers_.emplace_back([this] { work(); });
  }

  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }

  int size() const { return int(workers_.size()) + 1; }

  void run(int64_t count, int64_t grain, RangeBody body, const void* context) {
    if (in_loop_ || count <= grain || workers_.empty() || !busy_.try_lock()) {
      body(context, 0, count);
      return;
    }
    std::lock_guard<std::mutex> run_lock(busy_, std::adopt_lock);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      body_ = body;
      context_ = context;
      count_ = count;
      grain_ = grain;
      next_.store(0);
      active_ = int(workers_.size());
      ++generation_;
    }
    wake_.notify_all();
    drain();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return active_ == 0; });
  }

 private:
  void drain() {
    in_loop_ = true;
    for (;;) {
      const int64_t begin = next_.fetch_add(grain_);
      if (begin >= count_) break;
      body_(context_, begin, std::min(begin + grain_, count_));
    }
    in_loop_ = false;
  }

  void work() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      drain();
      std::lock_guard<std::mutex> lock(mutex_);
      if (--active_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex busy_;  // one parallel loop at a time
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  bool stop_ = false;
  uint64_t generation_ = 0;
  int active_ = 0;
  RangeBody body_ = nullptr;
  const void* context_ = nullptr;
  int64_t count_ = 0, grain_ = 1;
  std::atomic<int64_t> next_{0};
  static thread_local bool in_loop_;
};

thread_local bool ThreadPool::in_loop_ = false;

ThreadPool& pool() {
  static ThreadPool instance;
  return instance;
}

}  // namespace

void parallel_for(int64_t count, int64_t grain, RangeBody body, const void* context) {
  if (count <= 0) return;
  pool().run(count, std::max<int64_t>(grain, 1), body, context);
}

int thread_count() { return pool().size(); }

}  // namespace replayssm::cpu
