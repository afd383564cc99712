// The receiving half of a host transport. A rank posts its receives for a round; a
// peer's delivery for that round blocks until the matching receive is posted, then
// copies straight into the posted memory. So nothing is buffered beyond what the
// receiver posted: staging stays within the budget however far ahead a sender runs.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "executor/transport.h"

namespace shardsync::executor {

class Mailbox {
 public:
  // Posts this round's receives (one per peer at most).
  void Post(absl::string_view sync_id, int32_t round, absl::Span<const RecvOp> receives);
  // Called for a peer's chunk: waits until the receive is posted, then copies it in
  // or, for a `delta` (an encoding of the chunk), applies it onto the receive's
  // baseline, without the lock (several peers' chunks go in at once); a delta for a
  // receive without one is refused (INTERNAL naming the rank).
  absl::Status Deliver(absl::string_view sync_id, int32_t from, int32_t round, const uint8_t* data, int64_t bytes,
                       bool delta, absl::Time deadline);
  // Waits until every posted receive of the round is delivered; names the peers missing.
  // Returns only once no delivery writes the receives (also when aborted or late).
  absl::Status Wait(absl::Time deadline);
  // Fails every delivery and wait of `sync_id` (only that sync: a delivery for a later
  // one waits for its receive as usual).
  void Abort(absl::string_view sync_id, absl::string_view reason);
  // Forgets every receive once no delivery writes one.
  void Reset();

 private:
  struct Slot {
    RecvOp op;
    int32_t round = -1;
    bool claimed = false;  // a delivery took it (writing, or done)
    bool done = false;
  };
  absl::Mutex mu_;
  std::string sync_id_ ABSL_GUARDED_BY(mu_);
  std::map<int32_t, Slot> slots_ ABSL_GUARDED_BY(mu_);  // by peer
  int32_t copying_ ABSL_GUARDED_BY(mu_) = 0;            // deliveries writing a receive now
  std::string aborted_sync_ ABSL_GUARDED_BY(mu_);
  std::string aborted_ ABSL_GUARDED_BY(mu_);  // why, when aborted_sync_ is set
};

// An in-process transport between ranks in one process (threads), for tests of
// everything above the wire.
class LoopbackTransport final : public Transport {
 public:
  LoopbackTransport(int32_t rank, std::map<int32_t, Mailbox*> mailboxes)
      : rank_(rank), mailboxes_(std::move(mailboxes)) {}
  absl::string_view name() const override { return "loopback"; }
  bool device_memory() const override { return false; }
  absl::Status Setup(const PeerSetup&, absl::Time) override { return absl::OkStatus(); }
  absl::Status RunRound(absl::string_view sync_id, int32_t round, absl::Span<const SendOp> sends,
                        absl::Span<const RecvOp> receives, absl::Time deadline) override;
  void Abort(absl::string_view sync_id, absl::string_view reason) override {
    mailboxes_.at(rank_)->Abort(sync_id, reason);
  }
  void Reset() override { mailboxes_.at(rank_)->Reset(); }

 private:
  int32_t rank_;
  std::map<int32_t, Mailbox*> mailboxes_;
};

}  // namespace shardsync::executor
