// Turns a PrepareRequest into a PreparedSync this rank can run: decodes the schedule (or
// renews the one this rank holds), checks every peer, stream, buffer, role and bound it
// will touch, and maps the direct peers' targets it writes. Holds no state and no lock:
// mapping asks each direct peer (AgentControl.TargetMemory, up to an RPC deadline), so
// callers must hold no lock of theirs across Prepare.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/agent/peer_desk.h"
#include "daemon/agent/peer_targets.h"
#include "daemon/agent/registry.h"
#include "daemon/agent/sync_ledger.h"
#include "executor/transport.h"
#include "proto/shardsync.pb.h"

namespace shardsync::agent {

// The direct path between agents of one node (PrepareRequest.direct_peers). Without
// it an agent refuses a Prepare that names direct peers.
struct DirectPath {
  // Host messages between agents (signal boards on this host, the agents' gRPC channels
  // to others): each stage's completion of the direct copies, and the agreement
  // wherever the data transport has no device collective.
  executor::Transport* signals = nullptr;
  PeerTargets* targets = nullptr;  // maps the peers' targets this rank writes
  PeerDesk* desk = nullptr;        // told which of this rank's targets each peer writes
};

struct PreparerConfig {
  int32_t rank = 0;
  int64_t max_staging_bytes = int64_t{512} << 20;  // larger budgets are refused
  absl::Duration rpc_deadline = absl::Seconds(5);  // of each direct peer's TargetMemory
};

class Preparer {
 public:
  // `transport`: the data transport (whether it needs a communicator for non-direct peers).
  Preparer(PreparerConfig config, Registry& registry, const executor::Transport& transport, DirectPath direct)
      : config_(config), registry_(registry), transport_(transport), direct_(direct) {}

  // The sync of a new plan: `request` carries its schedule.
  absl::StatusOr<PreparedSync> Prepare(const v1::PrepareRequest& request) const;
  // Renews `prepared`, this rank's sync of request.digest, for `request`
  // (schedule_cached), in place. `map_direct`: map the direct peers' targets anew (a
  // Prepare call); else keep its mappings where the direct peers are the same (one
  // call). Once the request's own checks pass, `prepared` is named for the request's
  // sync even if a later check fails: the caller keeps it, and that sync takes part in
  // the agreement as not ready.
  absl::Status Renew(const v1::PrepareRequest& request, bool map_direct, PreparedSync& prepared) const;
  // This rank will not run sync `sync_id`: a direct peer's ask for its targets is
  // refused at once instead of waiting. Prepare and Renew call it when they refuse.
  void Refused(const std::string& sync_id) const;

  // Every buffer `local` touches on this rank registered, of the role the plan uses it
  // in, intact and in bounds: the mappings in `entries` (by buffer id) where given, else
  // the registry's.
  absl::Status CheckBuffers(const daemon::LocalSchedule& local,
                            std::vector<std::shared_ptr<const BufferEntry>> entries = {}) const;

 private:
  absl::StatusOr<PreparedSync> PrepareAndMap(const v1::PrepareRequest& request) const;
  absl::Status RenewAndMap(const v1::PrepareRequest& request, bool map_direct, PreparedSync& prepared) const;
  // The direct peers of `request`: checked, their targets this rank writes mapped and in
  // bounds, into `prepared`. Every other peer needs the transport: a device transport
  // without a communicator (none asked for) refuses them.
  absl::Status MapDirect(const v1::PrepareRequest& request, PreparedSync& prepared) const;

  const PreparerConfig config_;
  Registry& registry_;
  const executor::Transport& transport_;
  const DirectPath direct_;
};

}  // namespace shardsync::agent
