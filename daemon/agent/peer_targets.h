// The direct path's view of same-node peers' targets: asked of each peer agent by
// buffer name (AgentControl.TargetMemory, over the agents' own authenticated channel,
// never through the coordinator), mapped with this agent's memory backends, and kept
// while the peer hands out the same handle. Contract: a mapping lives as long as this
// object or a sync that holds it; closing it never frees the peer's memory.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/agent/peer_channels.h"
#include "daemon/agent/registry.h"
#include "executor/memory.h"
#include "proto/shardsync.pb.h"

namespace shardsync::agent {

// The payload (type URL) of PeerTargets::Map's error when the peer refused the sync
// itself: this rank then refuses as its follower (PrepareResponse.peer_refused).
inline constexpr char kPeerRefusedPayload[] = "type.shardsync/agent.PeerRefused";

class PeerTargets {
 public:
  // One TargetMemory call to the agent at `address`.
  using Ask = std::function<absl::StatusOr<v1::TargetMemoryResponse>(
      const std::string& address, const v1::TargetMemoryRequest& request, absl::Time deadline)>;
  // Asks over the agent's channels to its peers.
  static Ask OverGrpc(PeerChannels& channels);

  PeerTargets(int32_t rank, const Registry& registry, Ask ask)
      : rank_(rank), registry_(registry), ask_(std::move(ask)) {}

  // The mappings of `names` (buffers registered on `peer`, at `address`, that sync
  // `sync_id` has this rank write), in order; `scratch_bytes`: the size of the peer's
  // scratch where `names` holds it. Refuses
  // what the peer refuses, an answer that is not for these names, and a handle this
  // agent cannot open (each naming the buffer and the peer).
  absl::StatusOr<std::vector<std::shared_ptr<executor::MappedBuffer>>> Map(int32_t peer, const std::string& address,
                                                                           const std::string& sync_id,
                                                                           const std::vector<std::string>& names,
                                                                           int64_t scratch_bytes, absl::Time deadline);

 private:
  // Maps `buffer`, first fetching its descriptors from the peer where it was passed so.
  absl::StatusOr<std::unique_ptr<executor::MappedBuffer>> Open(const v1::RegisteredBuffer& buffer,
                                                               absl::Time deadline) const;

  struct Mapping {
    std::string handle;  // the registration it was opened from: its version, then the message
    std::shared_ptr<executor::MappedBuffer> memory;
  };
  const int32_t rank_;
  const Registry& registry_;
  const Ask ask_;
  absl::Mutex mu_;
  std::map<std::pair<int32_t, std::string>, Mapping> mappings_ ABSL_GUARDED_BY(mu_);  // by peer and name
};

}  // namespace shardsync::agent
