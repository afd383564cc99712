// Which agent holds each rank, how to reach it, what it published, and the layout
// epoch (one more with every publication). Thread-safe. A rank belongs to the agent
// incarnation that joined it until that one has been silent for kAgentLiveness.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "daemon/coordinator/agent_link.h"
#include "proto/shardsync.pb.h"

namespace shardsync::coordinator {

// An agent heard from (Join is its heartbeat) this recently is alive: it owns its rank.
inline constexpr absl::Duration kAgentLiveness = absl::Seconds(3);

class AgentDirectory {
 public:
  AgentDirectory(int32_t world_size, int64_t max_tensors, Credentials credentials, std::string instance_id);

  // An agent in this process: the one that joins with `incarnation` is called through
  // `link` (direct calls), not over gRPC.
  void SetLocalAgent(const std::string& incarnation, std::shared_ptr<AgentLink> link);

  struct Joined {
    v1::JoinResponse response;
    bool restarted = false;  // a new incarnation took the rank: its old layouts are gone
  };
  // Refuses fields out of bounds (INVALID_ARGUMENT), an agent of another build (its
  // contract id is not this coordinator's: FAILED_PRECONDITION, kept for RefusedJoins),
  // another certificate identity than the one the rank's first Join presented
  // (PERMISSION_DENIED), and a new incarnation while the rank's holder is alive
  // (ALREADY_EXISTS); nothing else changes then.
  absl::StatusOr<Joined> Join(const v1::JoinRequest& request, const std::string& identity);
  // The new layout epoch. Refuses fields out of bounds (INVALID_ARGUMENT), a rank that
  // has not joined (FAILED_PRECONDITION), another incarnation or certificate identity
  // than the rank's (PERMISSION_DENIED).
  absl::StatusOr<int64_t> Publish(const v1::PublishRequest& request, const std::string& identity);

  const std::string& instance_id() const { return instance_id_; }
  int64_t epoch() const;
  // Changes whenever a rank's agent or address changes: a communicator built before
  // holds a process that is gone.
  int64_t membership_version() const;
  // What every rank published, and the epoch it is of.
  std::map<int32_t, v1::PublishRequest> Published(int64_t* epoch) const;
  // The node index of every rank (JoinRequest.node, else host, numbered in rank order).
  std::vector<int32_t> NodeOfRank() const;
  std::map<int32_t, std::shared_ptr<AgentLink>> Links() const;
  // The links and addresses of the ranks joined, read at one moment.
  struct Contacts {
    std::map<int32_t, std::shared_ptr<AgentLink>> links;
    std::map<int32_t, std::string> addresses;
    bool all_agree_fast = true;  // every one agrees on its device (JoinRequest.fast_agreement)
    bool host_copies = false;    // some agent copies on its host's cores (JoinRequest.device "cpu")
  };
  Contacts CurrentContacts() const;
  // Every rank's JoinRequest (empty for a rank that has not joined), by rank.
  std::vector<v1::JoinRequest> Joins() const;
  std::vector<int32_t> MissingRanks() const;  // not joined
  // Ranks whose last Join was refused for its build and that no agent holds (none
  // joined, or its holder has been silent for kAgentLiveness): why, by rank.
  std::map<int32_t, std::string> RefusedJoins() const;
  // The ranks that published a target tensor, ascending.
  std::vector<int32_t> TargetRanks() const;
  // Of those ranks, each with the version its agent says its targets hold (empty: they
  // do not hold a completed sync).
  std::map<int32_t, std::string> TargetVersionsByOwnWord() const;
  // Agents, the epoch and the world, as the status reports them.
  void FillStatus(v1::CoordinatorStatus* status) const;
  void AppendMetrics(std::string* out) const;

 private:
  struct Entry {
    v1::JoinRequest join;
    std::string identity;             // the certificate identity of the rank's first Join
    std::shared_ptr<AgentLink> link;  // shared: a sync keeps it while a rejoin replaces it
    absl::Time last_seen;
  };

  // Publish's part under the lock: `request` replaces rank's publication, swapped into
  // `replaced` to be freed outside the lock.
  absl::StatusOr<int64_t> Replace(const v1::PublishRequest& request, const std::string& identity,
                                  v1::PublishRequest& replaced);

  const int32_t world_size_;
  const int64_t max_tensors_;  // in one rank's publication
  const Credentials credentials_;
  const std::string instance_id_;
  mutable absl::Mutex mu_;
  std::map<int32_t, Entry> agents_ ABSL_GUARDED_BY(mu_);
  std::map<int32_t, std::string> refused_ ABSL_GUARDED_BY(mu_);  // by rank: another build's Join
  std::string local_incarnation_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<AgentLink> local_link_ ABSL_GUARDED_BY(mu_);
  std::map<int32_t, v1::PublishRequest> published_ ABSL_GUARDED_BY(mu_);
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t membership_version_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardsync::coordinator
