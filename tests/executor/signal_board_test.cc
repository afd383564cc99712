// Signal boards: one-byte messages between the agents of one host, in order per sender,
// with void messages of syncs a sender left, deadlines and aborts that name the peer, and
// the agreement of ranks mixing boards with another transport.
#include "executor/signal_board.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "executor/mailbox.h"
#include "tests/common/unique_name.h"

namespace shardsync::executor {
namespace {

using Catch::Matchers::Contains;

std::string TestBoardName(absl::string_view what) {
  return SignalBoard::NameFor(testing::UniqueName(absl::StrCat("test-", what, "-")));
}

const std::function<bool()> kNever = [] { return false; };
const std::function<void()> kNothing = [] {};

absl::Time Soon() { return absl::Now() + absl::Milliseconds(50); }

TEST_CASE("a sender's messages arrive in order, through a full ring") {
  // Both ends sleeping on the futex at once, or polling their rings first.
  const absl::Duration poll_for = GENERATE(absl::ZeroDuration(), absl::Seconds(10));
  auto board = SignalBoard::Create(TestBoardName("order"));
  REQUIRE(board.ok());
  auto writer = SignalBoard::Open((*board)->name());
  REQUIRE(writer.ok());
  constexpr int kMessages = 1000;  // far more than a ring holds: the sender waits for the reader
  absl::Status sent;               // the sender's first failure (Catch asserts on this thread only)
  std::thread sender([&] {
    for (int i = 0; i < kMessages && sent.ok(); ++i) {
      sent = (*writer)->Post(3, SignalKey{SyncKey("s"), -2 - (i % 2)}, static_cast<uint8_t>(i),
                             absl::Now() + absl::Seconds(60), poll_for, kNever, kNothing);
    }
  });
  std::vector<absl::StatusOr<uint8_t>> taken;
  for (int i = 0; i < kMessages; ++i) {
    taken.push_back(
        (*board)->Take(3, SignalKey{SyncKey("s"), -2 - (i % 2)}, absl::Now() + absl::Seconds(10), poll_for, kNever));
    if (!taken.back().ok()) break;
  }
  sender.join();
  REQUIRE(sent.ok());
  REQUIRE(taken.size() == kMessages);
  for (int i = 0; i < kMessages; ++i) {
    REQUIRE(taken[i].ok());
    REQUIRE(*taken[i] == static_cast<uint8_t>(i));
  }
}

TEST_CASE("a message of a sync the sender left is void; one of a sync to come waits") {
  auto board = SignalBoard::Create(TestBoardName("void"));
  REQUIRE(board.ok());
  auto writer = SignalBoard::Open((*board)->name());
  REQUIRE(writer.ok());
  const SignalKey aborted{SyncKey("sync-1"), -2}, next{SyncKey("sync-2"), -1};
  REQUIRE((*writer)
              ->Post(1, aborted, 1, Soon(), absl::ZeroDuration(), kNever, kNothing)
              .ok());  // never taken: that sync was aborted here
  // The reader waiting for sync-2 sees sync-1's message, not yet void: it waits.
  const absl::StatusOr<uint8_t> early = (*board)->Take(1, next, Soon(), absl::ZeroDuration(), kNever);
  CHECK(absl::IsUnavailable(early.status()));
  CHECK_THAT(std::string(early.status().message()), Contains("from rank 1"));
  // Posting for sync-2 voids it.
  REQUIRE((*writer)->Post(1, next, 7, Soon(), absl::ZeroDuration(), kNever, kNothing).ok());
  const absl::StatusOr<uint8_t> value = (*board)->Take(1, next, Soon(), absl::ZeroDuration(), kNever);
  REQUIRE(value.ok());
  CHECK(*value == 7);
  // A reader still in sync-2 while the sender is in sync-3: the message stays for sync-3.
  const SignalKey later{SyncKey("sync-3"), -1};
  REQUIRE((*writer)->Post(1, later, 5, Soon(), absl::ZeroDuration(), kNever, kNothing).ok());
  CHECK(absl::IsUnavailable(
      (*board)->Take(1, SignalKey{SyncKey("sync-2"), -2}, Soon(), absl::ZeroDuration(), kNever).status()));
  const absl::StatusOr<uint8_t> kept = (*board)->Take(1, later, Soon(), absl::ZeroDuration(), kNever);
  REQUIRE(kept.ok());
  CHECK(*kept == 5);
}

TEST_CASE("a message of the same sync for another round is a protocol error") {
  auto board = SignalBoard::Create(TestBoardName("round"));
  REQUIRE(board.ok());
  auto writer = SignalBoard::Open((*board)->name());
  REQUIRE(writer.ok());
  REQUIRE((*writer)->Post(2, SignalKey{SyncKey("s"), -3}, 1, Soon(), absl::ZeroDuration(), kNever, kNothing).ok());
  const absl::StatusOr<uint8_t> value =
      (*board)->Take(2, SignalKey{SyncKey("s"), -2}, Soon(), absl::ZeroDuration(), kNever);
  CHECK(absl::IsInternal(value.status()));
  CHECK_THAT(std::string(value.status().message()), Contains("rank 2 sent round -3"));
}

TEST_CASE("a full ring waits for its reader until the deadline") {
  auto board = SignalBoard::Create(TestBoardName("full"));
  REQUIRE(board.ok());
  auto writer = SignalBoard::Open((*board)->name());
  REQUIRE(writer.ok());
  const SignalKey key{SyncKey("s"), -2};
  for (uint32_t i = 0; i < kRingDepth; ++i)
    REQUIRE((*writer)->Post(0, key, 1, Soon(), absl::ZeroDuration(), kNever, kNothing).ok());
  const absl::Status full = (*writer)->Post(0, key, 1, Soon(), absl::ZeroDuration(), kNever, kNothing);
  CHECK(absl::IsUnavailable(full));
  CHECK_THAT(std::string(full.message()), Contains("stayed full"));
  REQUIRE((*board)->Take(0, key, Soon(), absl::ZeroDuration(), kNever).ok());
  CHECK((*writer)->Post(0, key, 1, Soon(), absl::ZeroDuration(), kNever, kNothing).ok());
}

TEST_CASE("a polling wait ends at its deadline and at an abort, as a sleeping one does") {
  auto board = SignalBoard::Create(TestBoardName("poll"));
  REQUIRE(board.ok());
  auto writer = SignalBoard::Open((*board)->name());
  REQUIRE(writer.ok());
  const SignalKey key{SyncKey("s"), -2};
  const absl::Duration poll_for = absl::Minutes(5);  // far beyond every wait here
  absl::Time start = absl::Now();
  CHECK(absl::IsUnavailable((*board)->Take(0, key, start + absl::Milliseconds(50), poll_for, kNever).status()));
  CHECK(absl::Now() - start < absl::Minutes(1));  // the wait's end, not its 5 min of polling
  start = absl::Now();
  const auto aborted_soon = [&] { return absl::Now() - start > absl::Milliseconds(50); };
  CHECK(absl::IsAborted((*board)->Take(0, key, absl::InfiniteFuture(), poll_for, aborted_soon).status()));
  CHECK(absl::Now() - start < absl::Minutes(1));  // the wait's end, not its 5 min of polling
  for (uint32_t i = 0; i < kRingDepth; ++i)
    REQUIRE((*writer)->Post(0, key, 1, Soon(), poll_for, kNever, kNothing).ok());
  start = absl::Now();
  CHECK(absl::IsUnavailable((*writer)->Post(0, key, 1, start + absl::Milliseconds(50), poll_for, kNever, kNothing)));
  CHECK(absl::Now() - start < absl::Minutes(1));  // the wait's end, not its 5 min of polling
}

TEST_CASE("boards are this version's, unlinked by their owner, and orphans are removed") {
  const std::string name = TestBoardName("life");
  {
    auto board = SignalBoard::Create(name);
    REQUIRE(board.ok());
    CHECK(absl::IsUnavailable(SignalBoard::Create(name).status()));  // one owner
    CHECK(SignalBoard::Open(name).ok());
  }
  CHECK(absl::IsUnavailable(SignalBoard::Open(name).status()));  // gone with its owner

  const std::string other = TestBoardName("other");
  const int fd = shm_open(other.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 4096) == 0);
  close(fd);
  const absl::StatusOr<std::unique_ptr<SignalBoard>> wrong = SignalBoard::Open(other);
  CHECK(absl::IsFailedPrecondition(wrong.status()));
  CHECK_THAT(std::string(wrong.status().message()), Contains("is not a signal board"));
  shm_unlink(other.c_str());

  // A board left by a process that is gone (SIGKILLed agents cannot unlink theirs): its
  // lock went with it. The check does not depend on process ids, which another PID
  // namespace (a container, a sandbox) sharing /dev/shm would not see.
  const std::string orphan = TestBoardName("orphan");
  const pid_t child = fork();
  if (child == 0) {
    auto left = SignalBoard::Create(orphan);
    _exit(left.ok() ? 0 : 1);  // without the destructor: the board stays
  }
  REQUIRE(child > 0);
  int exit_status = -1;
  waitpid(child, &exit_status, 0);
  REQUIRE(exit_status == 0);
  REQUIRE(SignalBoard::Open(orphan).ok());
  auto alive = SignalBoard::Create(TestBoardName("alive"));
  REQUIRE(alive.ok());
  CHECK(SignalBoard::RemoveOrphans() >= 1);
  CHECK(absl::IsUnavailable(SignalBoard::Open(orphan).status()));
  CHECK(SignalBoard::Open((*alive)->name()).ok());  // held by this process: it stays
}

// Ranks 0-2 share a host (boards), rank 3 is elsewhere (the mailbox loopback). Rank 0
// polls its boards before it sleeps; the others sleep at once.
struct World {
  static constexpr int kRanks = 4;
  std::vector<std::unique_ptr<SignalBoard>> boards;
  std::vector<Mailbox> mailboxes = std::vector<Mailbox>(kRanks);
  std::vector<std::unique_ptr<LoopbackTransport>> loopbacks;
  std::vector<std::unique_ptr<BoardTransport>> transports;

  World() {
    std::map<int32_t, Mailbox*> by_rank;
    for (int r = 0; r < kRanks; ++r) by_rank[r] = &mailboxes[r];
    for (int r = 0; r < kRanks; ++r) {
      boards.push_back(*SignalBoard::Create(TestBoardName(absl::StrCat("world-", r))));
      loopbacks.push_back(std::make_unique<LoopbackTransport>(r, by_rank));
      transports.push_back(std::make_unique<BoardTransport>(r, *boards[r], *loopbacks[r],
                                                            r == 0 ? absl::Seconds(10) : absl::ZeroDuration()));
    }
  }
  PeerSetup SetupOf(int32_t rank) const {
    PeerSetup setup;
    setup.rank = rank;
    setup.world_size = kRanks;
    if (rank == 3) return setup;
    for (int r = 0; r < 3; ++r) {
      if (r != rank) setup.boards[r] = boards[r]->name();
    }
    return setup;
  }
};

TEST_CASE("ranks agree over boards and the other transport together") {
  World world;
  for (int r = 0; r < World::kRanks; ++r) REQUIRE(world.transports[r]->Setup(world.SetupOf(r), Soon()).ok());
  for (int not_ready : {-1, 0, 3}) {  // everyone ready; rank 0 (a board) or rank 3 (elsewhere) not
    const std::string sync = absl::StrCat("agree-", not_ready);
    std::vector<absl::StatusOr<bool>> results(World::kRanks, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int r = 0; r < World::kRanks; ++r) {
      threads.emplace_back([&, r] {
        results[r] =
            world.transports[r]->Agree(sync, world.SetupOf(r), r != not_ready, absl::Now() + absl::Seconds(10));
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < World::kRanks; ++r) {
      INFO("rank " << r << ", rank " << not_ready << " not ready");
      REQUIRE(results[r].ok());
      CHECK(*results[r] == (not_ready < 0));
    }
  }
}

TEST_CASE("a wait on a board ends at an abort with its reason, and the next sync runs") {
  World world;
  for (int r = 0; r < World::kRanks; ++r) REQUIRE(world.transports[r]->Setup(world.SetupOf(r), Soon()).ok());
  uint8_t byte = 0;
  absl::Status waited;
  std::thread waiting([&] {
    const RecvOp receive{1, &byte, 1};
    waited = world.transports[0]->RunRound("stuck", -2, {}, absl::MakeConstSpan(&receive, 1),
                                           absl::Now() + absl::Seconds(30));
  });
  absl::SleepFor(absl::Milliseconds(20));
  const absl::Time aborted = absl::Now();
  world.transports[0]->Abort("stuck", "the coordinator stopped it");
  waiting.join();
  CHECK(absl::Now() - aborted < absl::Seconds(15));  // the abort, not the wait's 30 s deadline
  CHECK(absl::IsAborted(waited));
  CHECK_THAT(std::string(waited.message()), Contains("the coordinator stopped it"));

  // Rank 1's message of "stuck", sent late, is void once it signals the next sync.
  const uint8_t one = 1;
  const SendOp late{0, &one, 1};
  REQUIRE(world.transports[1]->RunRound("stuck", -2, absl::MakeConstSpan(&late, 1), {}, Soon()).ok());
  world.transports[0]->Reset();
  absl::Status sent;
  std::thread next(
      [&] { sent = world.transports[1]->RunRound("next", -2, absl::MakeConstSpan(&late, 1), {}, Soon()); });
  const RecvOp receive{1, &byte, 1};
  const absl::Status received = world.transports[0]->RunRound("next", -2, {}, absl::MakeConstSpan(&receive, 1), Soon());
  next.join();
  CHECK(sent.ok());
  CHECK(received.ok());
  CHECK(byte == 1);
}

TEST_CASE("rings full of the votes of failed syncs do not block the next sync") {
  // Rank 3 (not on a board) never answers: each agreement of ranks 0-2 fails in the
  // other transport before any of them takes its board's votes, so every failed sync
  // leaves one vote in each ring. More failures than a ring holds, then all agree.
  World world;
  for (int r = 0; r < World::kRanks; ++r) REQUIRE(world.transports[r]->Setup(world.SetupOf(r), Soon()).ok());
  const auto agree = [&](const std::string& sync, int ranks, absl::Duration wait) {
    std::vector<absl::StatusOr<bool>> results(ranks, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back(
          [&, r] { results[r] = world.transports[r]->Agree(sync, world.SetupOf(r), true, absl::Now() + wait); });
    }
    for (std::thread& t : threads) t.join();
    return results;
  };
  for (uint32_t failed = 0; failed < kRingDepth + 2; ++failed) {
    for (const auto& result : agree(absl::StrCat("failed-", failed), 3, absl::Milliseconds(20))) {
      REQUIRE(absl::IsUnavailable(result.status()));  // rank 3 never answered
    }
    for (int r = 0; r < World::kRanks; ++r) world.transports[r]->Reset();
  }
  for (const auto& result : agree("after", World::kRanks, absl::Seconds(10))) {
    REQUIRE(result.ok());
    CHECK(*result);
  }
}

TEST_CASE("a silent peer fails the wait at the deadline, naming it") {
  World world;
  REQUIRE(world.transports[0]->Setup(world.SetupOf(0), Soon()).ok());
  uint8_t byte = 0;
  const RecvOp receive{2, &byte, 1};
  const absl::Status status = world.transports[0]->RunRound("s", -2, {}, absl::MakeConstSpan(&receive, 1), Soon());
  CHECK(absl::IsUnavailable(status));
  CHECK_THAT(std::string(status.message()), Contains("from rank 2"));
}

TEST_CASE("a board carries one byte per message") {
  World world;
  REQUIRE(world.transports[0]->Setup(world.SetupOf(0), Soon()).ok());
  const uint8_t two[2] = {1, 1};
  const SendOp send{1, two, 2};
  const absl::Status status = world.transports[0]->RunRound("s", -2, absl::MakeConstSpan(&send, 1), {}, Soon());
  CHECK(absl::IsInvalidArgument(status));
}

TEST_CASE("a board another process shrinks costs its messages, not the process") {
  auto board = SignalBoard::Create(TestBoardName("shrunk"));
  REQUIRE(board.ok());
  auto writer = SignalBoard::Open((*board)->name());
  REQUIRE(writer.ok());
  REQUIRE(truncate(("/dev/shm" + (*board)->name()).c_str(), 0) == 0);
  const SignalKey key{SyncKey("s"), -2};
  // Both mappings detach on their first touch: the post lands on the writer's own page,
  // and the reader waits out its deadline.
  CHECK((*writer)->Post(0, key, 1, Soon(), absl::ZeroDuration(), kNever, kNothing).ok());
  const absl::Time start = absl::Now();
  CHECK(absl::IsUnavailable(
      (*board)->Take(0, key, start + absl::Milliseconds(50), absl::ZeroDuration(), kNever).status()));
}

}  // namespace
}  // namespace shardsync::executor
