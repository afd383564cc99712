#include "executor/fault_transport.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace shardsync::executor {

FaultTransport::FaultTransport(std::unique_ptr<Transport> inner, StallFault fault)
    : inner_(std::move(inner)), fault_(std::move(fault)) {}

absl::Status FaultTransport::RunRound(absl::string_view sync_id, int32_t round, absl::Span<const SendOp> sends,
                                      absl::Span<const RecvOp> receives, absl::Time deadline) {
  bool stall = false;
  if (round == fault_.round) {
    absl::MutexLock lock(&mu_);
    stall = ++syncs_at_round_ == fault_.nth_sync;
  }
  if (!stall) return inner_->RunRound(sync_id, round, sends, receives, deadline);
  if (fault_.on_stall) fault_.on_stall(sync_id, round);
  absl::MutexLock lock(&mu_);
  const auto aborted = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return aborted_sync_ == sync_id; };
  if (mu_.AwaitWithDeadline(absl::Condition(&aborted), deadline)) return absl::AbortedError(aborted_reason_);
  return absl::UnavailableError(
      absl::StrCat("round ", round, " of sync ", sync_id, " stalled by --fault-stall-at-round until its deadline"));
}

void FaultTransport::Abort(absl::string_view sync_id, absl::string_view reason) {
  {
    absl::MutexLock lock(&mu_);
    aborted_sync_ = std::string(sync_id);
    aborted_reason_ = std::string(reason);
  }
  inner_->Abort(sync_id, reason);
}

}  // namespace shardsync::executor
