#include "daemon/agent/grpc_transport.h"

#include <chrono>

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
  struct Call {
    int32_t peer;
    std::shared_ptr<v1::AgentControl::Stub> stub;  // kept while the call runs
    grpc::ClientContext context;
    v1::TransferRequest request;
    v1::TransferResponse response;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Call>> calls;
  absl::Mutex done_mu;
  size_t done = 0;
  {
    absl::MutexLock lock(&mu_);
    if (aborted_sync_ == sync_id) return absl::AbortedError(aborted_reason_);
    running_sync_ = std::string(sync_id);
    for (const executor::SendOp& send : sends) {
      auto address = addresses_.find(send.peer);
      if (address == addresses_.end()) return absl::UnavailableError(absl::StrCat("no address for rank ", send.peer));
      auto call = std::make_unique<Call>();
      call->peer = send.peer;
      call->context.set_deadline(absl::ToChronoTime(deadline));
      // A peer that restarted on its port may find this channel still backing off from
      // the refused connections while it was down: wait for it (the deadline and an
      // abort still end the wait) rather than fail at once.
      call->context.set_wait_for_ready(true);
      call->request.set_sync_id(std::string(sync_id));
      call->request.set_from_rank(rank_);
      call->request.set_round(round);
      call->request.set_data(send.data, send.bytes);
      call->request.set_delta(send.delta);
      in_flight_.push_back(&call->context);
      call->stub = channels_.Stub(address->second);
      Call* raw = call.get();
      raw->stub->async()->Transfer(&raw->context, &raw->request, &raw->response,
                                   [raw, &done_mu, &done](grpc::Status status) {
                                     absl::MutexLock done_lock(&done_mu);
                                     raw->status = std::move(status);
                                     ++done;
                                   });
      calls.push_back(std::move(call));
    }
  }
  {
    absl::MutexLock lock(&done_mu);
    const size_t expected = calls.size();
    const auto all_answered = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(done_mu) { return done == expected; };
    done_mu.Await(absl::Condition(&all_answered));
  }
  {
    absl::MutexLock lock(&mu_);
    in_flight_.clear();  // one round at a time: they were all this round's
  }
  std::vector<std::string> failed;
  for (const auto& call : calls) {
    if (!call->status.ok())
      failed.push_back(absl::StrCat("rank ", call->peer, " (", call->status.error_message(), ")"));
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
