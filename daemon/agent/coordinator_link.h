// The agent's side of the coordinator: joins, publishes the registry's layouts whenever
// they change, and joins and publishes again when the coordinator comes back after a
// restart (its instance id changes). One background thread; every call has a deadline.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "daemon/agent/registry.h"
#include "proto/shardsync.grpc.pb.h"

namespace shardsync::agent {

// A new agent process's incarnation: 128 random bits in hex. It is the credential its
// Join and Publish carry (the coordinator takes a rank's layouts only with it), so it is
// never logged, echoed nor used in a name others can see.
std::string NewIncarnation();

struct LinkConfig {
  std::string coordinator;  // host:port; empty: this agent's own (it serves the coordinator)
  v1::JoinRequest join;     // rank, host, address, device
  absl::Duration rpc_deadline = absl::Seconds(5);
  absl::Duration heartbeat = absl::Seconds(1);
  Credentials credentials;  // TLS or, if asked, plaintext
};

class CoordinatorLink {
 public:
  CoordinatorLink(LinkConfig config, Registry& registry);
  ~CoordinatorLink();

  // Starts joining with `address` (host:port of this agent's AgentControl service).
  // Call once.
  void Start(const std::string& address);
  // The registry changed: publish soon.
  void Nudge();
  // The sync whose bytes this agent's targets hold (empty: none's, they are invalid):
  // said with every Join and Publish (so a coordinator that restarted learns it).
  void SetTargetVersion(const std::string& version);
  // Waits until registry version `version` (or later) is published; returns the layout
  // epoch, or -1 if the coordinator did not take it by `deadline`.
  int64_t WaitPublished(int64_t version, absl::Time deadline);
  bool joined() const;

 private:
  void Loop();

  LinkConfig config_;  // join.address is set by Start
  Registry& registry_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;  // made by Start
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool nudged_ ABSL_GUARDED_BY(mu_) = true;  // the first Join goes at once
  bool joined_ ABSL_GUARDED_BY(mu_) = false;
  std::string instance_ ABSL_GUARDED_BY(mu_);
  std::string join_error_ ABSL_GUARDED_BY(mu_);  // the last failed Join's, logged once
  int64_t published_version_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = -1;
  std::string target_version_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace shardsync::agent
