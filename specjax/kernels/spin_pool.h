// A tiny thread pool whose workers spin between jobs, for kernels of a few microseconds.
//
// A decode step calls a product kernel every 5-50 us. Handing half of such a call to a
// sleeping thread (XLA's intra-op pool) costs more than the half: the helper wakes after
// the caller has done most of the work (measured: a 0.9 MB q8_0 product ran no faster
// with XLA's pool than on one thread). The workers here spin for kSpinMicros after each
// job before they sleep, as llama.cpp's do, so during a step they pick work up at once.
//
// Run() is safe to call from several threads at once: one job runs on the pool at a
// time and a concurrent caller runs its own job alone. The caller claims chunks too and
// only waits for chunks a worker has claimed (and is running), so it never waits on a
// worker that is asleep or busy elsewhere.
#ifndef SPECJAX_KERNELS_SPIN_POOL_H_
#define SPECJAX_KERNELS_SPIN_POOL_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#define SPECJAX_PAUSE() _mm_pause()
#else
#define SPECJAX_PAUSE() ((void)0)
#endif

namespace specjax {

class SpinPool {
 public:
  // The process-wide pool: hardware threads - 1 workers (SPECJAX_KERNEL_THREADS overrides
  // the total), started on first use and never stopped.
  static SpinPool& Get() {
    static SpinPool* pool = new SpinPool();
    return *pool;
  }

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // body(c) for every c in [0, chunks), on the caller and the workers. `linger`: the
  // workers spin afterwards, expecting another job soon (a step's many small products);
  // false for a lone large product, after which they sleep at once and leave the cores
  // to XLA.
  void Run(int64_t chunks, std::function<void(int64_t)> body, bool linger = true) {
    if (chunks <= 1 || workers_.empty() || !busy_.try_lock()) {
      for (int64_t c = 0; c < chunks; ++c) body(c);
      return;
    }
    auto job = std::make_shared<Job>();
    job->body = std::move(body);
    job->chunks = chunks;
    job->linger = linger;
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = job;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    Drain(*job);
    while (job->done.load(std::memory_order_acquire) < chunks) SPECJAX_PAUSE();
    busy_.unlock();
  }

 private:
  static constexpr int64_t kSpinMicros = 300;  // SPECJAX_KERNEL_SPIN_US overrides

  struct Job {
    std::function<void(int64_t)> body;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    int64_t chunks = 0;
    bool linger = true;
  };

  SpinPool() {
    int total = static_cast<int>(std::thread::hardware_concurrency());
    if (const char* env = std::getenv("SPECJAX_KERNEL_THREADS")) total = std::atoi(env);
    if (const char* env = std::getenv("SPECJAX_KERNEL_SPIN_US")) spin_micros_ = std::atoi(env);
    for (int i = 1; i < std::max(total, 1); ++i) {
      workers_.emplace_back([this] { Work(); });
      workers_.back().detach();
    }
  }

  static void Drain(Job& job) {
    for (;;) {
      const int64_t c = job.next.fetch_add(1, std::memory_order_relaxed);
      if (c >= job.chunks) return;
      job.body(c);
      job.done.fetch_add(1, std::memory_order_release);
    }
  }

  void Work() {
    uint64_t seen = generation_.load(std::memory_order_acquire);
    bool linger = false;
    for (;;) {
      auto start = std::chrono::steady_clock::now();
      const auto spin = std::chrono::microseconds(linger ? spin_micros_ : 0);
      int spins = 0;
      while (generation_.load(std::memory_order_acquire) == seen) {
        SPECJAX_PAUSE();
        if (++spins % 256 == 0 && std::chrono::steady_clock::now() - start > spin) {
          std::unique_lock<std::mutex> lock(mu_);
          wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
          break;
        }
      }
      std::shared_ptr<Job> job;
      {
        std::lock_guard<std::mutex> lock(mu_);
        job = job_;
        seen = generation_.load(std::memory_order_acquire);
      }
      if (job) Drain(*job);
      linger = job && job->linger;
    }
  }

  int64_t spin_micros_ = kSpinMicros;
  std::vector<std::thread> workers_;
  std::mutex busy_;  // held by the caller whose job is on the pool
  std::mutex mu_;    // guards job_ and the sleep
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::shared_ptr<Job> job_;
};

}  // namespace specjax

#endif  // SPECJAX_KERNELS_SPIN_POOL_H_
