// For tests only: a Transport that wraps another and stalls one sync at a chosen round,
// so a test acts on an agent that is provably part way through a sync (its earlier
// rounds done, its targets partly written). The
// agent enables it with --fault-stall-at-round; everything else goes to the wrapped
// transport unchanged.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "executor/transport.h"

namespace shardsync::executor {

// Which round of which sync stalls.
struct StallFault {
  int32_t round = 0;     // the round that stalls (rounds count from 0; kAgreementRound never)
  int32_t nth_sync = 1;  // the n-th sync to reach `round` stalls (1: the first), once per process
  // Called on the sync's thread as the stall begins, before it waits.
  std::function<void(absl::string_view sync_id, int32_t round)> on_stall;
};

class FaultTransport final : public Transport {
 public:
  FaultTransport(std::unique_ptr<Transport> inner, StallFault fault);

  absl::string_view name() const override { return inner_->name(); }
  bool device_memory() const override { return inner_->device_memory(); }
  absl::Status Setup(const PeerSetup& setup, absl::Time deadline) override { return inner_->Setup(setup, deadline); }
  absl::StatusOr<std::string> NewCommunicatorId() override { return inner_->NewCommunicatorId(); }
  // The stalling round sends and receives nothing: it waits until the sync is aborted
  // (ABORTED) or the deadline passes (UNAVAILABLE). Any other round is the wrapped one's.
  absl::Status RunRound(absl::string_view sync_id, int32_t round, absl::Span<const SendOp> sends,
                        absl::Span<const RecvOp> receives, absl::Time deadline) override;
  absl::StatusOr<bool> Agree(absl::string_view sync_id, const PeerSetup& peers, bool ready,
                             absl::Time deadline) override {
    return inner_->Agree(sync_id, peers, ready, deadline);
  }
  bool fast_agreement() const override { return inner_->fast_agreement(); }
  absl::Status Finish(absl::Time deadline) override { return inner_->Finish(deadline); }
  // Ends a stall of `sync_id` too.
  void Abort(absl::string_view sync_id, absl::string_view reason) override;
  void Reset() override { inner_->Reset(); }

 private:
  const std::unique_ptr<Transport> inner_;
  const StallFault fault_;
  absl::Mutex mu_;
  int32_t syncs_at_round_ ABSL_GUARDED_BY(mu_) = 0;  // syncs that reached fault_.round
  // The last sync aborted and why (sync ids are unique: it never needs clearing).
  std::string aborted_sync_ ABSL_GUARDED_BY(mu_);
  std::string aborted_reason_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardsync::executor
