// The peer desk: hands this rank's targets to same-node peers that write them directly
// (AgentControl.TargetMemory) and remembers which registrations each peer was handed,
// so that a sync whose targets were registered again since is refused instead of
// letting that peer write the old memory. One lock, held only over its own map: an
// answer never waits for a sync (a peer asks while this agent prepares).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/agent/registry.h"
#include "daemon/agent/sync_ledger.h"
#include "proto/shardsync.pb.h"

namespace shardsync::agent {

class PeerDesk {
 public:
  PeerDesk(int32_t rank, Registry& registry) : rank_(rank), registry_(registry) {}

  // The handles of this rank's targets request.buffers, for peer request.from_rank;
  // makes the plan's scratch first where it is asked for (a peer may prepare before
  // this rank does).
  absl::StatusOr<v1::TargetMemoryResponse> TargetMemory(const v1::TargetMemoryRequest& request);
  // Every direct peer of `prepared` that writes this rank's targets mapped the
  // registrations they have now: else this rank is not ready.
  absl::Status CheckSendersMapped(const PreparedSync& prepared) const;

 private:
  const int32_t rank_;
  Registry& registry_;
  mutable absl::Mutex mu_;
  // By peer: the buffers it was last handed, each with its registration's version.
  std::map<int32_t, std::vector<std::pair<std::string, int64_t>>> handed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardsync::agent
