// The coordinator's rank pool: every Run calls each rank once, all at once (the caller's
// rank, 0 unless given, on the caller's thread), and returns only when all have
// returned; Runs follow one another.
#include "daemon/coordinator/rank_pool.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "tests/common/thread_cpu.h"

namespace shardsync::coordinator {
namespace {

TEST_CASE("each Run calls every rank once, in parallel, and waits for all of them") {
  constexpr int kRanks = 8;
  RankPool pool(kRanks);
  for (int run = 0; run < 500; ++run) {
    std::vector<std::atomic<int>> calls(kRanks);
    std::atomic<int> done{0};
    pool.Run([&](int32_t rank) {
      ++calls[rank];
      if (run % 100 == 0) absl::SleepFor(absl::Milliseconds(rank));  // uneven finishing
      ++done;
    });
    REQUIRE(done == kRanks);  // Run returned only after every call did
    for (int r = 0; r < kRanks; ++r) REQUIRE(calls[r] == 1);
  }
}

TEST_CASE("the ranks of one Run overlap: a call can wait for the others") {
  constexpr int kRanks = 4;
  RankPool pool(kRanks);
  absl::Mutex mu;
  int arrived = 0;
  std::set<std::thread::id> threads;
  pool.Run([&](int32_t) {
    absl::MutexLock lock(&mu);
    ++arrived;
    threads.insert(std::this_thread::get_id());
    // Every rank waits here until all have arrived: only possible if they run at once.
    mu.Await(absl::Condition(
        +[](int* n) { return *n == kRanks; }, &arrived));
  });
  CHECK(arrived == kRanks);
  CHECK(threads.size() == kRanks);
  CHECK(threads.count(std::this_thread::get_id()) == 1);  // rank 0 ran here
}

TEST_CASE("the caller's rank runs on the calling thread, every other rank on the pool's") {
  constexpr int kRanks = 4;
  RankPool pool(kRanks);
  for (int32_t caller = 0; caller < kRanks; ++caller) {
    absl::Mutex mu;
    std::vector<int> calls(kRanks);
    std::map<int32_t, std::thread::id> threads;
    pool.Run(
        [&](int32_t rank) {
          absl::MutexLock lock(&mu);
          ++calls[rank];
          threads[rank] = std::this_thread::get_id();
        },
        caller);
    for (int r = 0; r < kRanks; ++r) CHECK(calls[r] == 1);
    std::set<std::thread::id> distinct;
    for (const auto& [rank, id] : threads) {
      distinct.insert(id);
      CHECK((id == std::this_thread::get_id()) == (rank == caller));
    }
    CHECK(distinct.size() == kRanks);
  }
}

TEST_CASE("a Run that does not poll sleeps while its last rank works: its caller spends almost none of a core") {
  constexpr int kRanks = 4;
  RankPool pool(kRanks);
  const auto cpu_before = testing::ThreadCpu();
  pool.Run(
      [&](int32_t rank) {
        if (rank == kRanks - 1) absl::SleepFor(absl::Milliseconds(300));
      },
      0, std::chrono::steady_clock::duration::zero());
  // Polling would look for all of its 50 ms; a sleep costs microseconds.
  CHECK(testing::ThreadCpu() - cpu_before < kPollBeforeSleep / 5);
}

TEST_CASE("a group gate admits at most its limit of groups, and any rank of an admitted group") {
  GroupGate gate(1);
  gate.Enter(0);
  gate.Enter(0);  // a second rank of the admitted group: not held
  absl::Mutex mu;
  bool other_entered = false;
  std::thread other([&] {
    gate.Enter(1);
    absl::MutexLock lock(&mu);
    other_entered = true;
  });
  // Group 1 waits while group 0 is inside (a slow machine can only make this pass).
  absl::SleepFor(absl::Milliseconds(50));
  {
    absl::MutexLock lock(&mu);
    CHECK_FALSE(other_entered);
  }
  gate.Leave(0);
  {
    absl::MutexLock lock(&mu);
    CHECK_FALSE(other_entered);  // one rank of group 0 is still inside
  }
  gate.Leave(0);
  other.join();  // admitted once group 0 is out: a hang here fails by the test's timeout
  CHECK(other_entered);
  gate.Leave(1);
}

}  // namespace
}  // namespace shardsync::coordinator
