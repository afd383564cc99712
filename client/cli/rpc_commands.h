// `shardsyncctl sync | status | explain`: calls to the coordinator, printed as tables
// or JSON. Exit codes: 0 ok, 3 refused (bad input or a refusing agent), 4 failed.
#pragma once

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "common/tls.h"

namespace shardsync::cli {

struct RpcCommandConfig {
  std::string coordinator = "127.0.0.1:7070";
  Credentials credentials;  // TLS, or plaintext with --insecure
  int64_t timeout_ms = 0;   // 0: the coordinator's sync deadline; other calls 30 s
  // explain only; 0: the coordinator's cost model
  double link_gbps = 0;
  double memory_gbps = 0;
  double network_gbps = 0;
  bool json = false;
  bool watch = false;                 // sync: live progress per rank while it runs
  bool verify = false;                // sync: compare target checksums with their sources
  bool links = false;                 // sync, explain: every link's bytes too (SyncRequest.links)
  std::vector<int32_t> target_ranks;  // sync, explain: only these ranks' targets (empty: all)
};

// Exit codes: 0 ok, 2 usage, 3 refused (nothing moved), 4 failed (targets invalid),
// kUnreachable: the coordinator could not be reached (nothing ran).
inline constexpr int kUnreachable = 5;

int RunSyncCommand(const RpcCommandConfig& config, std::ostream& out, std::ostream& err);
int RunStatusCommand(const RpcCommandConfig& config, std::ostream& out, std::ostream& err);
int RunExplainCommand(const RpcCommandConfig& config, std::ostream& out, std::ostream& err);
int RunAgentsCommand(const RpcCommandConfig& config, std::ostream& out, std::ostream& err);

}  // namespace shardsync::cli
