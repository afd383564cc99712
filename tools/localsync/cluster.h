// Real processes on this machine: a coordinator, agents and demo clients, started from
// the runfiles of the binary or test that links this (daemon/..., tools/localsync/...)
// with OS-chosen ports and a private folder (MakeTempDir: under $TEST_TMPDIR in a test),
// removed at the end; the agents' unix sockets are there too unless that path is too
// long for them (SocketDirFor). The C++ end-to-end tests and the CPU main job run on it;
// shardsync.testing (Python) does the same where only dist/ and Python are (GPU machines).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "common/tls.h"
#include "tools/localsync/process.h"
#include "tools/localsync/temp_dir.h"

namespace shardsync::localsync {

struct ClusterOptions {
  int agents = 4;
  int64_t staging_bytes = 1 << 20;
  int64_t sync_timeout_ms = 10000;
  int64_t rpc_deadline_ms = 5000;                  // the daemons' default; loaded CI machines need it
  std::map<int, int64_t> agent_max_staging_bytes;  // per rank, default the agent's
  // Per rank, more flags for the agent the constructor starts (a restart by StartAgent
  // goes without them): a test's faults (--fault-stall-at-round).
  std::map<int, std::vector<std::string>> agent_flags;
  bool metrics = false;                    // every daemon serves /metrics on an OS-chosen port
  TlsConfig tls;                           // CA, certificate and key of every daemon; none: --insecure
  bool agent0_serves_coordinator = false;  // no coordinator process: agent 0 is it
  std::vector<std::string> nodes;          // each rank's --node (none: every agent on this host's)
  std::string relay;                       // the coordinator's --relay (empty: its default)
  std::string direct;                      // the coordinator's --direct (empty: its default)
  std::string delta;                       // the coordinator's --delta (empty: its default)
  int64_t scratch_bytes = 0;               // the coordinator's --scratch-bytes (0: its default)
};

// A coordinator and one agent per rank, all on localhost (or agent 0 serving as the
// coordinator: ClusterOptions::agent0_serves_coordinator).
class Cluster {
 public:
  explicit Cluster(ClusterOptions options);
  ~Cluster();
  const std::string& coordinator() const { return coordinator_address_; }
  std::string socket(int rank) const;
  // The cluster's folder: logs, port files, layout specs.
  const std::string& dir() const { return dir_.path(); }
  // The folder of the agents' sockets (dir() unless its paths are too long for a socket);
  // names up to 32 bytes fit there.
  const std::string& socket_dir() const { return socket_dir_.path(); }
  // The TCP security flags every daemon of this cluster runs with; shardsyncctl needs them too.
  std::vector<std::string> security_flags() const;
  client::CoordinatorClient coordinator_client() const;
  // Starts (or, after it died, restarts) the agent of `rank`; a restart listens on the
  // port it had, as a daemon with a fixed --listen does.
  void StartAgent(int rank);
  // Kills the coordinator (SIGKILL) and starts a new one on the same port. This and
  // coordinator_process() need a coordinator process (not agent0_serves_coordinator).
  void RestartCoordinator();
  // With ClusterOptions::metrics: the metrics port of the coordinator (-1) or a rank.
  int MetricsPort(int rank) const;
  Process& agent(int rank) { return *agents_.at(rank); }
  Process& coordinator_process() { return *coordinator_; }
  // A client helper (tools/localsync/demo_client) for one rank and side; its buffers are the
  // shared memory objects `shm_prefix` + "-r<rank>-<buffer name>".
  struct Client {
    std::unique_ptr<Process> process;
    std::string shm_prefix;
  };
  Client StartClient(const std::string& spec, int rank, bool sources, uint64_t seed,
                     const std::string& extra_flags = "");
  // Dumps every process's log to stderr (on failure, to see why).
  void DumpLogs() const;

 private:
  void StartAgent(int rank, const std::vector<std::string>& extra_flags);
  void StartCoordinator(const std::string& listen);
  std::string ShmPrefix() const;  // unique to this cluster: "/ss-<folder suffix>-"

  ClusterOptions options_;
  Credentials credentials_;
  ScopedDir dir_;  // removed with the cluster, also when its constructor throws
  ScopedDir socket_dir_;
  std::string coordinator_address_;
  std::unique_ptr<Process> coordinator_;
  std::map<int, std::unique_ptr<Process>> agents_;
  std::map<int, int> agent_ports_;
  int clients_started_ = 0;
};

}  // namespace shardsync::localsync
