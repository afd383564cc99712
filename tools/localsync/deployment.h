// One layout deployed on a Cluster: a trainer client on every rank that holds sources,
// a rollout client on every rank that holds targets, and checks of the targets' bytes.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/types.h"
#include "proto/shardsync.pb.h"
#include "spec/layout_spec.h"
#include "tools/localsync/cluster.h"
#include "tools/localsync/contents.h"

namespace shardsync::localsync {

class Deployment {
 public:
  // Writes `spec_json` into the cluster's folder and starts every client with `seed`
  // (sources) and poison `seed` (targets). `extra_flags` go to the trainer of
  // `extra_rank` (-1: none).
  Deployment(Cluster& cluster, const std::string& name, const std::string& spec_json, uint64_t seed,
             int extra_rank = -1, const std::string& extra_flags = "");
  ~Deployment();  // clients leave; waits until every agent dropped them

  // Every client's first line: "ready ..." (registered) or why not; then waits until
  // the coordinator shows every client published.
  std::vector<std::string> WaitReady();
  // Waits until the coordinator shows every client published; false at the deadline.
  bool WaitPublished();
  // Rewrites every trainer's sources with the values of `seed`: all of them, or the
  // `changed` fraction SetChanged gave (SourceStep), the rest keeping the first seed's.
  void Refill(uint64_t seed);
  void SetChanged(double changed) { changed_ = changed; }
  // The rollout of `rank` killed and started again, as an inference engine that
  // restarted: new memory, poisoned, registered anew. Returns its first line once the
  // coordinator shows it published ("ready ..." or why not).
  std::string RestartRollout(int rank);
  // Every target buffer's bytes as they are now.
  Contents ReadTargets() const;
  // Mismatches between the targets and a sync of `seed` (first few), empty when exact;
  // only the targets on `ranks` when given.
  std::vector<std::string> CheckTargets(uint64_t seed, const std::set<int>& ranks = {}) const;
  // Source buffers whose bytes are not exactly those written for `seed` (empty when none
  // changed: nobody wrote into a source).
  std::vector<std::string> CheckSources(uint64_t seed) const;
  // Every target byte that differs from a sync of `seed`, counted.
  int64_t MismatchedBytes(uint64_t seed) const;
  const planner::PlanInput& input() const { return input_; }
  uint64_t poison() const { return poison_; }
  std::string RolloutAddress(int rank);
  SourceStep StepOf(uint64_t seed) const { return SourceStep{poison_, seed, changed_}; }
  Process& trainer(int rank) { return *trainers_.at(rank).process; }
  Process& rollout(int rank) { return *rollouts_.at(rank).process; }

 private:
  std::vector<planner::Buffer> TargetBuffers() const;  // the rollouts' arenas
  // Waits until the coordinator shows `clients` published per rank; false at the deadline.
  bool WaitCoordinatorShows(const std::map<int, int>& clients);

  Cluster& cluster_;
  spec::BufferIds ids_;
  planner::PlanInput input_;
  uint64_t poison_;  // also the first seed of the sources
  double changed_ = 1.0;
  std::string spec_path_;
  std::map<int, Cluster::Client> trainers_;
  std::map<int, Cluster::Client> rollouts_;
};

absl::StatusOr<v1::SyncResponse> SyncOnce(const Cluster& cluster, absl::Duration timeout, bool verify = false);
// The same for a whole request (SyncRequest.links, ...).
absl::StatusOr<v1::SyncResponse> SyncOnce(const Cluster& cluster, v1::SyncRequest request, absl::Duration timeout);

}  // namespace shardsync::localsync
