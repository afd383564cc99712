#include "executor/mailbox.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "executor/delta_codec.h"

namespace shardsync::executor {

void Mailbox::Post(absl::string_view sync_id, int32_t round, absl::Span<const RecvOp> receives) {
  absl::MutexLock lock(&mu_);
  sync_id_ = std::string(sync_id);
  for (const RecvOp& op : receives) slots_[op.peer] = Slot{op, round};
}

absl::Status Mailbox::Take(Slot& slot, int32_t from, const Piece& piece) {
  const int32_t round = slot.round;
  if (piece.delta && !slot.op.baseline) {
    return absl::InternalError(
        absl::StrCat("rank ", from, " sent a delta for round ", round, "; this receive holds no baseline"));
  }
  if (piece.chunk_bytes != slot.op.bytes) {
    return absl::InternalError(absl::StrCat("rank ", from, " sent ", piece.chunk_bytes, " bytes for round ", round,
                                            "; the receive expects ", slot.op.bytes));
  }
  const int64_t offset = piece.offset, span = piece.span;
  if (offset < 0 || span < 0 || span > slot.op.bytes || offset > slot.op.bytes - span ||
      (!piece.delta && piece.bytes != span)) {
    return absl::InternalError(absl::StrCat("rank ", from, " sent ", span, " bytes at ", offset, " of round ", round,
                                            " in ", piece.bytes, "; the receive holds ", slot.op.bytes));
  }
  const int64_t end = offset + span;  // within the receive: checked above
  const auto after = slot.taken.upper_bound(offset);
  const bool over_before = after != slot.taken.begin() && std::prev(after)->second > offset;
  const bool over_after = after != slot.taken.end() && after->first < end;
  if (span > 0 && (over_before || over_after)) {
    return absl::InternalError(
        absl::StrCat("rank ", from, " sent bytes ", offset, " to ", end, " of round ", round, " twice"));
  }
  if (span > 0) slot.taken.emplace(offset, end);
  return absl::OkStatus();
}

absl::Status Mailbox::Deliver(absl::string_view sync_id, int32_t from, int32_t round, const Piece& piece,
                              absl::Time deadline) {
  RecvOp op;
  {
    absl::MutexLock lock(&mu_);
    const auto aborted = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return aborted_sync_ == sync_id; };
    const auto posted = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (aborted()) return true;
      auto it = slots_.find(from);
      return sync_id_ == sync_id && it != slots_.end() && it->second.round == round;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&posted), deadline)) {
      return absl::DeadlineExceededError(absl::StrCat("no receive posted for round ", round, " from rank ", from));
    }
    if (aborted()) return absl::AbortedError(aborted_);
    Slot& slot = slots_[from];
    if (absl::Status taken = Take(slot, from, piece); !taken.ok()) {
      return taken;  // the receive stays undone: its Wait names this rank
    }
    op = slot.op;
    ++copying_;
  }
  // The copy or the delta's application runs unlocked: deliveries from several peers
  // go side by side, and Wait, Reset and an abort wait for it to end.
  const absl::Time start = absl::Now();
  absl::Status written = absl::OkStatus();
  if (piece.delta) {
    if (const absl::Status applied = ApplyDelta(piece.data, piece.bytes, op.data + piece.offset, piece.span);
        !applied.ok()) {
      written = absl::InternalError(absl::StrCat("rank ", from, "'s delta for round ", round, ": ", applied.message()));
    }
  } else if (piece.bytes > 0) {
    std::memcpy(op.data + piece.offset, piece.data, piece.bytes);
  }
  const int64_t nanos = absl::ToInt64Nanoseconds(absl::Now() - start);
  absl::MutexLock lock(&mu_);
  --copying_;
  if (!written.ok()) return written;  // the receive stays undone: its Wait names this rank
  if (piece.delta && op.apply_nanos != nullptr) *op.apply_nanos += nanos;  // shared by the round's receives
  Slot& slot = slots_.at(from);
  slot.written += piece.span;
  slot.delivered = true;
  return absl::OkStatus();
}

absl::Status Mailbox::Wait(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  const auto aborted = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return aborted_sync_ == sync_id_; };
  const auto complete = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (aborted()) return copying_ == 0;  // nothing writes the receives once this returns
    for (const auto& [peer, slot] : slots_) {
      if (!slot.done()) return false;
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
      if (!slot.done()) missing.push_back(peer);
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

std::vector<Mailbox::Piece> PiecesOf(const SendOp& send) {
  std::vector<Mailbox::Piece> pieces;
  const bool delta = !send.delta_ends.empty();
  const int64_t chunk_bytes = delta ? send.chunk_bytes : send.bytes;
  int64_t offset = 0, begin = 0;  // in the chunk, in `data`
  do {
    const int64_t span = std::min(kPieceBytes, chunk_bytes - offset);
    const int64_t end = delta ? send.delta_ends[pieces.size()] : begin + span;
    pieces.push_back(Mailbox::Piece{send.data + begin, end - begin, offset, span, chunk_bytes, delta});
    offset += span;
    begin = end;
  } while (offset < chunk_bytes);
  return pieces;
}

absl::Status LoopbackTransport::RunRound(absl::string_view sync_id, int32_t round, absl::Span<const SendOp> sends,
                                         absl::Span<const RecvOp> receives, absl::Time deadline) {
  Mailbox* own = mailboxes_.at(rank_);
  own->Post(sync_id, round, receives);
  for (const SendOp& send : sends) {
    auto it = mailboxes_.find(send.peer);
    if (it == mailboxes_.end()) return absl::UnavailableError(absl::StrCat("rank ", send.peer, " is unknown"));
    for (const Mailbox::Piece& piece : PiecesOf(send)) {
      if (auto s = it->second->Deliver(sync_id, rank_, round, piece, deadline); !s.ok()) {
        return absl::UnavailableError(absl::StrCat("sending to rank ", send.peer, ": ", s.message()));
      }
    }
  }
  return own->Wait(deadline);
}

}  // namespace shardsync::executor
