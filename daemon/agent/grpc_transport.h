// The host transport between agents over their own gRPC channels: a round posts its
// receives in the mailbox (AgentControl.Transfer from peers lands there), then sends
// every chunk to its peer, all peers in parallel, over the agent's PeerChannels. A
// chunk goes piece by piece (executor::PiecesOf: kPieceBytes of it, or of its delta's
// encoding, a Transfer call each), kPiecesInFlight at a time per peer: the next piece
// is copied and sent while the one before crosses the link and the peer copies it in,
// and each answer is traffic the connection's keepalive sees. A failed or aborted sync
// drops every channel, so the next sync connects afresh (peer_channels.h says why).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "daemon/agent/peer_channels.h"
#include "executor/mailbox.h"
#include "executor/transport.h"
#include "grpcpp/grpcpp.h"
#include "proto/shardsync.grpc.pb.h"

namespace shardsync::agent {

inline constexpr int kPiecesInFlight = 2;

class GrpcTransport final : public executor::Transport {
 public:
  GrpcTransport(int32_t rank, executor::Mailbox& mailbox, PeerChannels& channels)
      : rank_(rank), mailbox_(mailbox), channels_(channels) {}

  absl::string_view name() const override { return "grpc-host"; }
  bool device_memory() const override { return false; }
  // Keeps the peers' AgentControl addresses (channels are made per address when first used).
  absl::Status Setup(const executor::PeerSetup& setup, absl::Time deadline) override;
  absl::Status RunRound(absl::string_view sync_id, int32_t round, absl::Span<const executor::SendOp> sends,
                        absl::Span<const executor::RecvOp> receives, absl::Time deadline) override;
  void Abort(absl::string_view sync_id, absl::string_view reason) override;
  void Reset() override;

 private:
  const int32_t rank_;
  executor::Mailbox& mailbox_;
  PeerChannels& channels_;
  absl::Mutex mu_;
  std::map<int32_t, std::string> addresses_ ABSL_GUARDED_BY(mu_);
  // The calls of the round running now (a rank runs one at a time); Abort cancels them.
  std::vector<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);
  std::string running_sync_ ABSL_GUARDED_BY(mu_);  // whose calls they are
  // The last sync aborted and why: a round it starts later sends nothing (its sends
  // would wait for a peer that may be gone).
  std::string aborted_sync_ ABSL_GUARDED_BY(mu_);
  std::string aborted_reason_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardsync::agent
