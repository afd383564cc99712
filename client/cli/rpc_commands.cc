#include "client/cli/rpc_commands.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/cli/format.h"
#include "client/cli/report.h"
#include "client/cli/sync_table.h"
#include "client/cpp/client.h"

namespace shardsync::cli {
namespace {

int ExitCode(const absl::Status& status) {
  return absl::IsFailedPrecondition(status) || absl::IsInvalidArgument(status) || absl::IsNotFound(status) ? 3 : 4;
}

int Fail(const char* command, const absl::Status& status, std::ostream& err) {
  err << "shardsyncctl " << command << ": " << absl::StatusCodeToString(status.code()) << ": " << status.message()
      << "\n";
  return ExitCode(status);
}

// How long a call other than a sync may take, unless --timeout-ms says.
constexpr absl::Duration kCallDeadline = absl::Seconds(30);

absl::Duration CallDeadline(const RpcCommandConfig& c) {
  return c.timeout_ms > 0 ? absl::Milliseconds(c.timeout_ms) : kCallDeadline;
}

// The coordinator's status, the first call of every command: when it fails the
// coordinator could not be reached and nothing ran (exit code kUnreachable).
absl::StatusOr<v1::CoordinatorStatus> Reach(client::CoordinatorClient& coordinator, const RpcCommandConfig& c,
                                            const char* command, std::ostream& err) {
  auto status = coordinator.Status(CallDeadline(c));
  if (!status.ok()) {
    err << "shardsyncctl " << command << ": cannot reach the coordinator at " << c.coordinator << " ("
        << absl::StatusCodeToString(status.status().code()) << ": " << status.status().message() << "); nothing ran\n";
  }
  return status;
}

// "valid", or which ranks are not and how to write them again.
std::string TargetsValidity(const v1::CoordinatorStatus& status) {
  if (status.targets_valid()) return "valid";
  const std::string ranks = absl::StrJoin(status.invalid_target_ranks(), ",");
  return absl::StrCat("INVALID on rank ", absl::StrJoin(status.invalid_target_ranks(), ", rank "),
                      " until a sync writes them (shardsyncctl sync, or sync --target-ranks ", ranks, ")");
}

// A line per agent: where it is, whether it is heard from (a heartbeat about every
// second; "silent" after 3 s without one) and when it last was, its clients.
void PrintAgents(const v1::CoordinatorStatus& status, std::ostream& out) {
  out << absl::StrFormat("%-6s %-22s %-16s %-16s %-8s %-8s %10s %-8s %s\n", "rank", "address", "host", "node", "device",
                         "state", "last seen", "clients", "targets hold");
  for (const v1::AgentInfo& a : status.agents()) {
    out << absl::StrFormat("%-6d %-22s %-16s %-16s %-8s %-8s %8.1fs %-8d %s\n", a.rank(), a.address(), a.host(),
                           a.node(), a.device(), a.reachable() ? "joined" : "silent", a.seconds_since_seen(),
                           a.clients(), a.target_version().empty() ? "-" : a.target_version());
  }
  if (status.agents_size() < status.world_size()) {
    out << absl::StrFormat("%d of %d agents have not joined\n", status.world_size() - status.agents_size(),
                           status.world_size());
  }
}

}  // namespace

// Prints each rank's progress every 100 ms until `done` is set.
void Watch(const RpcCommandConfig& c, const std::atomic<bool>& done, std::ostream& out) {
  client::CoordinatorClient coordinator(c.coordinator, c.credentials);
  out << "watching the sync (bytes done per rank):\n";
  while (!done) {
    auto status = coordinator.Status(absl::Seconds(2));
    if (status.ok() && !status->running_sync_id().empty()) {
      std::string line = status->running_sync_id() + ":";
      for (const v1::RankProgress& p : status->progress()) {
        absl::StrAppend(&line, " rank ", p.rank(), " ", Bytes(p.bytes_done()), "/", Bytes(p.bytes_total()), " (round ",
                        p.rounds_done(), "/", p.rounds_total(), ")");
      }
      out << line << "\n" << std::flush;
    }
    for (int i = 0; i < 10 && !done; ++i) absl::SleepFor(absl::Milliseconds(10));
  }
}

int RunSyncCommand(const RpcCommandConfig& c, std::ostream& out, std::ostream& err) {
  client::CoordinatorClient coordinator(c.coordinator, c.credentials);
  const auto reached = Reach(coordinator, c, "sync", err);
  if (!reached.ok()) return kUnreachable;
  // The coordinator's deadline, or a smaller one asked for (the coordinator takes the smaller).
  absl::Duration timeout = absl::Milliseconds(reached->sync_timeout_ms());
  if (c.timeout_ms > 0) timeout = std::min(timeout, absl::Milliseconds(c.timeout_ms));
  std::atomic<bool> done{false};
  std::thread watcher;
  if (c.watch) watcher = std::thread([&] { Watch(c, done, out); });
  v1::SyncRequest request;
  request.set_verify(c.verify);
  request.set_links(c.links);
  request.mutable_target_ranks()->Add(c.target_ranks.begin(), c.target_ranks.end());
  auto response = coordinator.Sync(std::move(request), timeout);
  done = true;
  if (watcher.joinable()) watcher.join();
  if (!response.ok()) return Fail("sync", response.status(), err);
  if (c.json) {
    PrintJson(*response, out);
    return 0;
  }
  PrintSyncTable(*response, out);
  if (!c.target_ranks.empty()) {  // a partial sync: say which other targets it left invalid
    const auto after = coordinator.Status(CallDeadline(c));
    if (after.ok() && !after->targets_valid()) out << "other targets: " << TargetsValidity(*after) << "\n";
  }
  return 0;
}

int RunStatusCommand(const RpcCommandConfig& c, std::ostream& out, std::ostream& err) {
  client::CoordinatorClient coordinator(c.coordinator, c.credentials);
  auto status = Reach(coordinator, c, "status", err);
  if (!status.ok()) return kUnreachable;
  if (c.json) {
    PrintJson(*status, out);
    return 0;
  }
  out << absl::StrFormat("coordinator %s: %d of %d agents joined, layout epoch %d\n", c.coordinator,
                         status->agents_size(), status->world_size(), status->layout_epoch());
  out << absl::StrFormat(
      "last sync %s: %s%s; targets %s\n\n", status->last_sync_id().empty() ? "-" : status->last_sync_id(),
      status->last_sync_id().empty() ? "none yet" : (status->last_sync_ok() ? "ok" : "failed"),
      status->last_sync_error().empty() ? "" : " (" + status->last_sync_error() + ")", TargetsValidity(*status));
  PrintAgents(*status, out);
  return 0;
}

int RunExplainCommand(const RpcCommandConfig& c, std::ostream& out, std::ostream& err) {
  client::CoordinatorClient coordinator(c.coordinator, c.credentials);
  if (!Reach(coordinator, c, "explain", err).ok()) return kUnreachable;
  v1::ExplainRequest request;
  request.set_link_gbps(c.link_gbps);
  request.set_memory_gbps(c.memory_gbps);
  request.set_network_gbps(c.network_gbps);
  request.set_links(c.links);
  request.mutable_target_ranks()->Add(c.target_ranks.begin(), c.target_ranks.end());
  auto explain = coordinator.Explain(request, CallDeadline(c));
  if (!explain.ok()) return Fail("explain", explain.status(), err);
  if (c.json) {
    PrintJson(*explain, out);
    return 0;
  }
  PrintPlanReport(*explain, absl::StrCat("plan of epoch ", explain->layout_epoch()), c.links, out);
  return 0;
}

int RunAgentsCommand(const RpcCommandConfig& c, std::ostream& out, std::ostream& err) {
  client::CoordinatorClient coordinator(c.coordinator, c.credentials);
  auto status = Reach(coordinator, c, "agents", err);
  if (!status.ok()) return kUnreachable;
  if (c.json) {
    PrintJson(*status, out);  // the whole status: a part of it would print others' defaults as values
    return 0;
  }
  PrintAgents(*status, out);
  return 0;
}

}  // namespace shardsync::cli
