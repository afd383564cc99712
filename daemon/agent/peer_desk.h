// The peer desk: hands this rank's targets to same-node peers that write them directly
// (AgentControl.TargetMemory), only to the peers a sync this rank prepares has write
// them and only the buffers they write, and remembers which registrations each peer
// was handed, so that a sync whose targets were registered again since is refused
// instead of letting that peer write the old memory. One lock, held only over its own
// maps: an answer waits for this rank to prepare the sync (a peer asks while this agent
// prepares), never for a sync to run.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <set>
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
  // `wait`: how long an ask waits for this rank to prepare the sync it names.
  // `descriptor_socket`: where peers fetch the descriptors of targets passed as such.
  PeerDesk(int32_t rank, Registry& registry, absl::Duration wait, std::string descriptor_socket = "")
      : rank_(rank), registry_(registry), wait_(wait), descriptor_socket_(std::move(descriptor_socket)) {}

  // Sync `sync_id` (being prepared here) has these peers write these buffers here; the
  // last kSyncsKept syncs are kept.
  void Expect(const std::string& sync_id, PlannedWriters writers);
  // The handles of this rank's targets request.buffers, for peer request.from_rank,
  // once this rank prepares sync request.sync_id (waiting up to `wait`); refuses
  // (PERMISSION_DENIED) a peer or buffer that sync does not have write here, and a
  // scratch of another size; answers `refused` (no buffers) when this rank refused the
  // sync. Makes the plan's scratch first where it is asked for.
  absl::StatusOr<v1::TargetMemoryResponse> TargetMemory(const v1::TargetMemoryRequest& request);
  // Every direct peer of `prepared` that writes this rank's targets mapped the
  // registrations they have now: else this rank is not ready.
  absl::Status CheckSendersMapped(const PreparedSync& prepared) const;

 private:
  static constexpr size_t kSyncsKept = 16;

  // The buffers sync `sync_id` has `peer` write here, and this rank's scratch size in
  // it, waiting up to `wait_` for this rank to prepare it; `refused` set (no buffers)
  // when this rank refused it.
  absl::StatusOr<std::set<std::string>> PlannedFor(const std::string& sync_id, int32_t peer, int64_t* scratch_bytes,
                                                   bool* refused);

  const int32_t rank_;
  Registry& registry_;
  const absl::Duration wait_;
  const std::string descriptor_socket_;
  mutable absl::Mutex mu_;
  std::map<std::string, PlannedWriters> planned_ ABSL_GUARDED_BY(mu_);  // by sync id
  std::deque<std::string> planned_order_ ABSL_GUARDED_BY(mu_);          // oldest first
  // By peer: the buffers it was last handed, each with its registration's version.
  std::map<int32_t, std::vector<std::pair<std::string, int64_t>>> handed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardsync::agent
