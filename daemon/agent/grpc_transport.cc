#include "daemon/agent/grpc_transport.h"

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_status.h"

namespace shardsync::agent {

absl::Status GrpcTransport::Setup(const executor::PeerSetup& setup, absl::Time) {
  absl::MutexLock lock(&mu_);
  for (const auto& [rank, address] : setup.addresses) addresses_[rank] = address;
  return absl::OkStatus();
}

absl::Status GrpcTransport::RunRound(absl::string_view sync_id, int32_t round, absl::Span<const executor::SendOp> sends,
                                     absl::Span<const executor::RecvOp> receives, absl::Time deadline) {
  mailbox_.Post(sync_id, round, receives);
  struct Stream {  // one send, piece by piece
    int32_t peer = 0;
    std::shared_ptr<v1::AgentControl::Stub> stub;  // kept while its calls run
    std::vector<executor::Mailbox::Piece> pieces;
    size_t next = 0;  // the next piece to send
    int in_flight = 0;
    grpc::Status failed;  // its first failure
  };
  struct Piece {
    Stream* stream;
    grpc::ClientContext context;
    v1::TransferRequest request;
    v1::TransferResponse response;
  };
  std::vector<Stream> streams(sends.size());
  {
    absl::MutexLock lock(&mu_);
    if (aborted_sync_ == sync_id) return absl::AbortedError(aborted_reason_);
    running_sync_ = std::string(sync_id);
    for (size_t i = 0; i < sends.size(); ++i) {
      auto address = addresses_.find(sends[i].peer);
      if (address == addresses_.end())
        return absl::UnavailableError(absl::StrCat("no address for rank ", sends[i].peer));
      streams[i].peer = sends[i].peer;
      streams[i].stub = channels_.Stub(address->second);
      streams[i].pieces = executor::PiecesOf(sends[i]);
    }
  }
  std::deque<Piece> pieces;  // alive until the round ends: an abort may cancel any of them
  absl::Mutex done_mu;
  bool stop = false;  // ABSL_GUARDED_BY(done_mu): a piece failed or the sync was aborted; send no more
  while (true) {
    std::vector<Piece*> ready;
    {
      absl::MutexLock lock(&done_mu);
      const auto sendable = [&](const Stream& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(done_mu) {
        return !stop && s.next < s.pieces.size() && s.in_flight < kPiecesInFlight;
      };
      const auto can_act = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(done_mu) {
        bool busy = false;
        for (const Stream& s : streams) {
          if (sendable(s)) return true;
          busy = busy || s.in_flight > 0;
        }
        return !busy;
      };
      done_mu.Await(absl::Condition(&can_act));
      for (Stream& s : streams) {
        while (sendable(s)) {
          const executor::Mailbox::Piece& part = s.pieces[s.next++];
          Piece& piece = pieces.emplace_back();
          piece.stream = &s;
          piece.request.set_sync_id(std::string(sync_id));
          piece.request.set_from_rank(rank_);
          piece.request.set_round(round);
          piece.request.set_data(part.data, part.bytes);
          piece.request.set_delta(part.delta);
          piece.request.set_offset(part.offset);
          piece.request.set_span_bytes(part.span);
          piece.request.set_chunk_bytes(part.chunk_bytes);
          ++s.in_flight;
          ready.push_back(&piece);
        }
      }
    }
    if (ready.empty()) break;  // nothing left to send and nothing in flight
    absl::MutexLock lock(&mu_);
    if (aborted_sync_ == sync_id) {  // sends nothing more; what is in flight was cancelled
      absl::MutexLock done_lock(&done_mu);
      stop = true;
      for (Piece* piece : ready) {
        --piece->stream->in_flight;
        if (piece->stream->failed.ok()) piece->stream->failed = grpc::Status(grpc::CANCELLED, aborted_reason_);
      }
      continue;
    }
    for (Piece* piece : ready) {
      piece->context.set_deadline(absl::ToChronoTime(deadline));
      // A peer that restarted on its port may find this channel still backing off from
      // the refused connections while it was down: wait for it (the deadline and an
      // abort still end the wait) rather than fail at once.
      piece->context.set_wait_for_ready(true);
      in_flight_.push_back(&piece->context);
      piece->stream->stub->async()->Transfer(&piece->context, &piece->request, &piece->response,
                                             [piece, &done_mu, &stop](grpc::Status status) {
                                               absl::MutexLock done_lock(&done_mu);
                                               Stream& stream = *piece->stream;
                                               --stream.in_flight;
                                               // Answered: its copy is freed now (clear would keep it).
                                               std::unique_ptr<std::string> copy(piece->request.release_data());
                                               if (status.ok()) return;
                                               stop = true;
                                               if (stream.failed.ok()) stream.failed = std::move(status);
                                             });
    }
  }
  {
    absl::MutexLock lock(&mu_);
    in_flight_.clear();  // one round at a time: they were all this round's
  }
  std::vector<std::string> failed;
  for (const Stream& s : streams) {
    if (!s.failed.ok()) failed.push_back(absl::StrCat("rank ", s.peer, " (", s.failed.error_message(), ")"));
  }
  if (!failed.empty()) {
    channels_.Drop();
    return absl::UnavailableError(absl::StrCat("sending round ", round, " failed to ", absl::StrJoin(failed, ", ")));
  }
  return mailbox_.Wait(deadline);
}

void GrpcTransport::Abort(absl::string_view sync_id, absl::string_view reason) {
  mailbox_.Abort(sync_id, reason);
  absl::MutexLock lock(&mu_);
  aborted_sync_ = std::string(sync_id);
  aborted_reason_ = std::string(reason);
  if (running_sync_ != sync_id) return;  // a late abort must not cancel a later sync's calls
  for (grpc::ClientContext* context : in_flight_) context->TryCancel();
  channels_.Drop();
}

void GrpcTransport::Reset() { mailbox_.Reset(); }

}  // namespace shardsync::agent
