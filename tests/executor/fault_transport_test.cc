// FaultTransport: every round goes to the wrapped transport except the chosen round of
// the chosen sync, which waits until that sync is aborted or its deadline passes.
#include "executor/fault_transport.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace shardsync::executor {
namespace {

using Catch::Matchers::Contains;

// Records the rounds it runs and the syncs it is told to abort; every call succeeds.
class RecordingTransport final : public Transport {
 public:
  RecordingTransport(std::vector<int32_t>& rounds, std::vector<std::string>& aborted)
      : rounds_(rounds), aborted_(aborted) {}
  absl::string_view name() const override { return "recording"; }
  bool device_memory() const override { return false; }
  absl::Status Setup(const PeerSetup&, absl::Time) override { return absl::OkStatus(); }
  absl::Status RunRound(absl::string_view, int32_t round, absl::Span<const SendOp>, absl::Span<const RecvOp>,
                        absl::Time) override {
    rounds_.push_back(round);
    return absl::OkStatus();
  }
  void Abort(absl::string_view sync_id, absl::string_view) override { aborted_.emplace_back(sync_id); }
  void Reset() override {}

 private:
  std::vector<int32_t>& rounds_;
  std::vector<std::string>& aborted_;
};

absl::Status Round(Transport& transport, const std::string& sync_id, int32_t round, absl::Duration timeout) {
  return transport.RunRound(sync_id, round, {}, {}, absl::Now() + timeout);
}

TEST_CASE("only the n-th sync to reach the round stalls, until its deadline; every other round passes through") {
  std::vector<int32_t> rounds;
  std::vector<std::string> aborted;
  std::vector<std::pair<std::string, int32_t>> stalls;
  StallFault fault;
  fault.round = 2;
  fault.nth_sync = 2;
  fault.on_stall = [&](absl::string_view sync_id, int32_t round) { stalls.emplace_back(sync_id, round); };
  FaultTransport transport(std::make_unique<RecordingTransport>(rounds, aborted), std::move(fault));
  CHECK(transport.name() == "recording");

  for (int32_t round = 0; round < 4; ++round) REQUIRE(Round(transport, "sync-1", round, absl::Seconds(5)).ok());
  CHECK(stalls.empty());
  REQUIRE(Round(transport, "sync-2", 0, absl::Seconds(5)).ok());
  REQUIRE(Round(transport, "sync-2", 1, absl::Seconds(5)).ok());
  const absl::Time start = absl::Now();
  const absl::Status stalled = Round(transport, "sync-2", 2, absl::Milliseconds(100));
  CHECK(absl::Now() - start >= absl::Milliseconds(100));
  CHECK(absl::IsUnavailable(stalled));
  CHECK_THAT(std::string(stalled.message()), Contains("round 2 of sync sync-2"));
  CHECK(stalls == std::vector<std::pair<std::string, int32_t>>{{"sync-2", 2}});
  for (int32_t round = 0; round < 4; ++round) REQUIRE(Round(transport, "sync-3", round, absl::Seconds(5)).ok());
  CHECK(rounds == std::vector<int32_t>{0, 1, 2, 3, 0, 1, 0, 1, 2, 3});  // the stalled round never reached it
  CHECK(stalls.size() == 1);
}

TEST_CASE("aborting the stalled sync ends the stall with ABORTED and reaches the wrapped transport") {
  std::vector<int32_t> rounds;
  std::vector<std::string> aborted;
  absl::Notification stall_began;
  StallFault fault;
  fault.round = 0;
  fault.on_stall = [&](absl::string_view, int32_t) { stall_began.Notify(); };
  FaultTransport transport(std::make_unique<RecordingTransport>(rounds, aborted), std::move(fault));

  absl::Status status = absl::UnknownError("not run");
  const absl::Time start = absl::Now();
  std::thread sync([&] { status = Round(transport, "sync-1", 0, absl::Seconds(60)); });
  stall_began.WaitForNotification();
  transport.Abort("sync-1", "the coordinator gave up");
  sync.join();
  CHECK(absl::Now() - start < absl::Seconds(30));
  CHECK(absl::IsAborted(status));
  CHECK_THAT(std::string(status.message()), Contains("the coordinator gave up"));
  CHECK(aborted == std::vector<std::string>{"sync-1"});
  CHECK(rounds.empty());
}

}  // namespace
}  // namespace shardsync::executor
