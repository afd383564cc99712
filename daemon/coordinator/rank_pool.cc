#include "daemon/coordinator/rank_pool.h"

namespace shardsync::coordinator {

RankPool::RankPool(int32_t ranks) {
  for (int32_t r = 1; r < ranks; ++r) threads_.emplace_back([this, r] { Worker(r); });
}

RankPool::~RankPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void RankPool::Run(const std::function<void(int32_t)>& fn, int32_t caller_rank,
                   std::chrono::steady_clock::duration poll_for) {
  {
    absl::MutexLock lock(&mu_);
    job_ = &fn;
    caller_rank_ = caller_rank;
    running_ = static_cast<int32_t>(threads_.size());
    ++generation_;
  }
  fn(caller_rank);
  PollFor([this] { return running_.load(std::memory_order_acquire) == 0; }, poll_for);
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](std::atomic<int32_t>* running) { return running->load(std::memory_order_acquire) == 0; }, &running_));
  job_ = nullptr;
}

void RankPool::Worker(int32_t slot) {
  int64_t seen = 0;
  while (true) {
    const std::function<void(int32_t)>* job;
    int32_t rank;
    {
      absl::MutexLock lock(&mu_);
      const auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || generation_ != seen; };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      seen = generation_;
      job = job_;
      rank = slot == caller_rank_ ? 0 : slot;
    }
    (*job)(rank);
    absl::MutexLock lock(&mu_);
    running_.fetch_sub(1, std::memory_order_release);
  }
}

void GroupGate::Enter(int32_t group) {
  absl::MutexLock lock(&mu_);
  const auto admitted = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return inside_.count(group) > 0 || static_cast<int32_t>(inside_.size()) < limit_;
  };
  mu_.Await(absl::Condition(&admitted));
  ++inside_[group];
}

void GroupGate::Leave(int32_t group) {
  absl::MutexLock lock(&mu_);
  if (--inside_[group] == 0) inside_.erase(group);
}

}  // namespace shardsync::coordinator
