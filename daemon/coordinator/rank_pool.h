// The fan-out of a sync's phases (Prepare, Execute) without starting 2 x world threads
// on every sync: one rank runs on the calling thread, every other rank on a thread of
// its own started once. One Run at a time; a call made from inside a Run must not use
// the same pool.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/polling.h"

namespace shardsync::coordinator {

class RankPool {
 public:
  explicit RankPool(int32_t ranks);
  ~RankPool();
  RankPool(const RankPool&) = delete;
  RankPool& operator=(const RankPool&) = delete;

  // Calls fn(rank) for every rank at once, fn(caller_rank) on the calling thread;
  // returns when all returned, polling for the last of them for `poll_for` before it
  // sleeps (common/polling.h: zero beside agents that copy on the host's cores).
  void Run(const std::function<void(int32_t)>& fn, int32_t caller_rank = 0,
           std::chrono::steady_clock::duration poll_for = kPollBeforeSleep);

 private:
  // Thread `slot` (1..ranks-1) runs rank `slot`, except the caller's rank, whose thread
  // runs rank 0.
  void Worker(int32_t slot);

  absl::Mutex mu_;
  const std::function<void(int32_t)>* job_ ABSL_GUARDED_BY(mu_) = nullptr;
  int32_t caller_rank_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // one more for every Run
  std::atomic<int32_t> running_{0};              // changed under mu_ (so that Await sees it), polled without it
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// Admits at most `limit` groups at once; the ranks of an admitted group enter freely.
// Bounds what a phase holds (schedules made for Prepare) without splitting a group
// whose members wait for each other (agents of one host on the direct path).
class GroupGate {
 public:
  explicit GroupGate(int32_t limit) : limit_(limit) {}
  void Enter(int32_t group);
  void Leave(int32_t group);

 private:
  absl::Mutex mu_;
  const int32_t limit_;
  std::map<int32_t, int32_t> inside_ ABSL_GUARDED_BY(mu_);  // by admitted group: its ranks inside
};

}  // namespace shardsync::coordinator
