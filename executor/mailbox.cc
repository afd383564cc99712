#include "executor/mailbox.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "executor/delta_codec.h"

namespace shardsync::executor {

void Mailbox::Post(absl::string_view sync_id, int32_t round, absl::Span<const RecvOp> receives) {
  absl::MutexLock lock(&mu_);
  sync_id_ = std::string(sync_id);
  for (const RecvOp& op : receives) slots_[op.peer] = Slot{op, round, false};
}

absl::Status Mailbox::Deliver(absl::string_view sync_id, int32_t from, int32_t round, const uint8_t* data,
                              int64_t bytes, bool delta, absl::Time deadline) {
  RecvOp op;
  {
    absl::MutexLock lock(&mu_);
    const auto aborted = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return aborted_sync_ == sync_id; };
    const auto posted = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (aborted()) return true;
      auto it = slots_.find(from);
      return sync_id_ == sync_id && it != slots_.end() && it->second.round == round && !it->second.claimed;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&posted), deadline)) {
      return absl::DeadlineExceededError(absl::StrCat("no receive posted for round ", round, " from rank ", from));
    }
    if (aborted()) return absl::AbortedError(aborted_);
    Slot& slot = slots_[from];
    slot.claimed = true;
    op = slot.op;
    ++copying_;
  }
  // The copy or the delta's application runs unlocked: deliveries from several peers
  // go side by side, and Wait, Reset and an abort wait for it to end.
  const absl::Time start = absl::Now();
  absl::Status written = absl::OkStatus();
  if (delta) {
    if (!op.baseline) {
      written = absl::InternalError(
          absl::StrCat("rank ", from, " sent a delta for round ", round, "; this receive holds no baseline"));
    } else if (const absl::Status applied = ApplyDelta(data, bytes, op.data, op.bytes); !applied.ok()) {
      written = absl::InternalError(absl::StrCat("rank ", from, "'s delta for round ", round, ": ", applied.message()));
    }
  } else if (bytes != op.bytes) {
    written = absl::InternalError(
        absl::StrCat("rank ", from, " sent ", bytes, " bytes for round ", round, "; the receive expects ", op.bytes));
  } else if (bytes > 0) {
    std::memcpy(op.data, data, bytes);
  }
  const int64_t nanos = absl::ToInt64Nanoseconds(absl::Now() - start);
  absl::MutexLock lock(&mu_);
  --copying_;
  if (!written.ok()) return written;  // the receive stays undone: its Wait names this rank
  if (delta && op.apply_nanos != nullptr) *op.apply_nanos += nanos;  // shared by the round's receives
  slots_.at(from).done = true;
  return absl::OkStatus();
}

absl::Status Mailbox::Wait(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  const auto aborted = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return aborted_sync_ == sync_id_; };
  const auto complete = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (aborted()) return copying_ == 0;  // nothing writes the receives once this returns
    for (const auto& [peer, slot] : slots_) {
      if (!slot.done) return false;
    }
    return true;
  };
  const bool finished = mu_.AwaitWithDeadline(absl::Condition(&complete), deadline);
  const auto idle = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return copying_ == 0; };
  mu_.Await(absl::Condition(&idle));  // a copy under way ends before the caller reuses its memory
  if (aborted()) return absl::AbortedError(aborted_);
  if (!finished) {
    std::vector<int32_t> missing;
    for (const auto& [peer, slot] : slots_) {
      if (!slot.done) missing.push_back(peer);
    }
    return absl::UnavailableError(
        absl::StrCat("no data from rank ", absl::StrJoin(missing, ", rank "), " before the deadline"));
  }
  slots_.clear();
  return absl::OkStatus();
}

void Mailbox::Abort(absl::string_view sync_id, absl::string_view reason) {
  absl::MutexLock lock(&mu_);
  aborted_sync_ = std::string(sync_id);
  aborted_ = reason.empty() ? "aborted" : std::string(reason);
}

void Mailbox::Reset() {
  absl::MutexLock lock(&mu_);
  const auto idle = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return copying_ == 0; };
  mu_.Await(absl::Condition(&idle));
  aborted_sync_.clear();
  aborted_.clear();
  slots_.clear();
}

absl::Status LoopbackTransport::RunRound(absl::string_view sync_id, int32_t round, absl::Span<const SendOp> sends,
                                         absl::Span<const RecvOp> receives, absl::Time deadline) {
  Mailbox* own = mailboxes_.at(rank_);
  own->Post(sync_id, round, receives);
  for (const SendOp& send : sends) {
    auto it = mailboxes_.find(send.peer);
    if (it == mailboxes_.end()) return absl::UnavailableError(absl::StrCat("rank ", send.peer, " is unknown"));
    if (auto s = it->second->Deliver(sync_id, rank_, round, send.data, send.bytes, send.delta, deadline); !s.ok()) {
      return absl::UnavailableError(absl::StrCat("sending to rank ", send.peer, ": ", s.message()));
    }
  }
  return own->Wait(deadline);
}

}  // namespace shardsync::executor
