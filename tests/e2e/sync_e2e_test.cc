// End to end on this machine's CPU: a real coordinator, 4 real agents and trainer and
// rollout client processes registering shared memory, talking gRPC. Every target byte
// is checked after every sync.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cpp/client.h"
#include "common/contract_id.h"
#include "executor/transport.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "planner/schedule.h"
#include "proto/health.grpc.pb.h"
#include "tests/e2e/small_model.h"
#include "tools/localsync/deployment.h"
#include "tools/localsync/http_get.h"

namespace shardsync::localsync {
namespace {

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

int64_t BytesSent(const v1::SyncResponse& response) {
  int64_t sent = 0;
  for (const v1::RankStats& r : response.ranks()) sent += r.sent_bytes();
  return sent;
}

TEST_CASE(
    "ZeRO-1/2/3 over 4 ranks into TP2x2, uneven TP4, TP1 on half and on all ranks, TP2 on ranks 2-3 sync exactly, "
    "twice, over the direct path and staged") {
  for (const std::string direct : {"auto", "never"}) {
    ClusterOptions options;
    options.direct = direct;  // auto: agents of one host write each other's shared memory
    Cluster cluster(options);
    for (int stage = 1; stage <= 3; ++stage) {
      for (const Layout& layout : kLayouts) {
        INFO("--direct " << direct << ", zero stage " << stage << " into " << layout.name);
        Deployment deployment(cluster, absl::StrCat("zero", stage, "-", layout.name), ModelJson(stage, layout.replicas),
                              /*seed=*/stage * 100 + 1);
        RequireReady(deployment);
        const std::string address = deployment.RolloutAddress(layout.first_target_rank);
        CHECK(deployment.CheckTargets(stage * 100 + 1).size() > 0);  // poisoned before the sync

        v1::SyncRequest with_links;
        with_links.set_links(true);
        auto first = SyncOnce(cluster, with_links, absl::Seconds(20));
        if (!first.ok()) cluster.DumpLogs();
        REQUIRE(first.ok());
        std::vector<std::string> errors = deployment.CheckTargets(stage * 100 + 1);
        INFO((errors.empty() ? "" : errors.front()));
        CHECK(errors.empty());
        // Under ZeRO-1/2 every rank holds the whole flat: nothing crosses processes.
        if (stage < 3) CHECK(BytesSent(*first) == 0);

        for (const v1::RankStats& r : first->ranks()) {
          // Direct: every byte between agents written in place, no staging; else none.
          CHECK(r.direct_sent_bytes() == (direct == "auto" ? r.sent_bytes() : 0));
          CHECK(r.direct_received_bytes() == (direct == "auto" ? r.received_bytes() : 0));
          if (direct == "auto") CHECK(r.peak_staging_bytes() == 0);
        }
        for (const v1::LinkBytes& link : first->links()) {
          CHECK(link.path() == (direct == "auto" ? v1::DIRECT : v1::STAGED));
        }
        if (stage == 3) CHECK(first->links_size() > 0);

        deployment.Refill(stage * 100 + 2);
        auto second = SyncOnce(cluster, absl::Seconds(20));
        REQUIRE(second.ok());
        CHECK(second->plan_seconds() == 0);  // the cached plan of this epoch
        CHECK(second->links_size() == 0);    // not asked for
        // Agents of one host agree through their signal boards: no Prepare call.
        CHECK(second->one_call());
        errors = deployment.CheckTargets(stage * 100 + 2);
        CHECK(errors.empty());
        CHECK(deployment.RolloutAddress(layout.first_target_rank) == address);  // the arena never moves
      }
    }
  }
}

// Linear layers block-quantized into float8 (vLLM's layout) beside bfloat16 ones:
// 128 x 128 blocks cut by ZeRO-3 partitions and by TP splits that are no multiple of 128.
std::string Float8ModelJson(const std::string& replicas) {
  return absl::StrCat(R"({"model": {"tensors": [
      {"name": "embed", "shape": [100, 16], "style": "VOCAB"},
      {"name": "gate", "shape": [256, 200], "style": "COLUMN"},
      {"name": "up", "shape": [256, 200], "style": "COLUMN"},
      {"name": "down", "shape": [200, 256], "style": "ROW"},
      {"name": "odd", "shape": [300, 130], "style": "COLUMN"},
      {"name": "norm", "shape": [16]}],
    "fused_rows": [{"parts": ["gate", "up"]}],
    "zero_stage": 3, "dp_ranks": [0, 1, 2, 3], "target_dtype": "FLOAT8_E4M3", "replicas": )",
                      replicas, "}}");
}

TEST_CASE(
    "float8 block-quantized targets from ZeRO-3 bfloat16 sources: exact twice, in scratch groups, direct and "
    "staged") {
  for (const std::string direct : {"auto", "never"}) {
    ClusterOptions options;
    options.direct = direct;
    options.scratch_bytes = 64 << 10;  // one or two shards of a rank per group
    Cluster cluster(options);
    for (const Layout& layout : {kLayouts[0], kLayouts[1]}) {
      INFO("--direct " << direct << " into " << layout.name);
      Deployment deployment(cluster, absl::StrCat("float8-", layout.name), Float8ModelJson(layout.replicas), 7);
      RequireReady(deployment);
      auto first = SyncOnce(cluster, absl::Seconds(20), /*verify=*/true);
      if (!first.ok()) cluster.DumpLogs();
      REQUIRE(first.ok());
      std::vector<std::string> errors = deployment.CheckTargets(7);
      INFO((errors.empty() ? "" : errors.front()));
      CHECK(errors.empty());
      CHECK(first->stages() > 2);  // several groups of the scratch budget
      int64_t quantized = 0;
      for (const v1::RankStats& r : first->ranks()) {
        quantized += r.quantized_bytes();
        CHECK(r.scratch_bytes() > 0);
        CHECK(r.scratch_bytes() <= options.scratch_bytes);
        if (direct == "never") CHECK(r.direct_received_bytes() == 0);
      }
      const int replicas = layout.name == std::string("tp2x2") ? 2 : 1;
      CHECK(quantized == replicas * (2 * 256 * 200 + 200 * 256 + 300 * 130));
      CHECK(first->quantized_bytes() == quantized);
      CHECK(first->relayed_bytes() == 0);  // several stages, none of them a relay
      // Verify compares the bfloat16 tensors; float8 bytes are not their sources'.
      CHECK(first->verified_placements() > 0);
      CHECK(first->unverified_quantized_placements() == 4 * 4);  // 4 tensors on each of 4 ranks

      deployment.Refill(8);
      auto second = SyncOnce(cluster, absl::Seconds(20));
      REQUIRE(second.ok());
      CHECK(second->plan_seconds() == 0);
      errors = deployment.CheckTargets(8);
      INFO((errors.empty() ? "" : errors.front()));
      CHECK(errors.empty());
      CHECK(deployment.CheckSources(8).empty());
    }
  }
}

TEST_CASE("one agent: the first sync prepares, every later one is a single Execute call, all exact") {
  ClusterOptions options;
  options.agents = 1;
  Cluster cluster(options);
  Deployment deployment(cluster, "one-agent", ModelJson(3, R"([{"ranks": [0]}])", "[0]"), 21);
  RequireReady(deployment);
  auto first = SyncOnce(cluster, absl::Seconds(20));
  REQUIRE(first.ok());
  CHECK_FALSE(first->one_call());
  CHECK(first->host_copies());  // a CPU agent: clients' waits for the next syncs sleep at once
  CHECK(deployment.CheckTargets(21).empty());
  for (uint64_t seed = 22; seed < 25; ++seed) {
    deployment.Refill(seed);
    CHECK(deployment.CheckTargets(seed).size() > 0);  // the targets hold the last values
    auto next = SyncOnce(cluster, absl::Seconds(20));
    REQUIRE(next.ok());
    CHECK(next->one_call());
    CHECK(next->prepare_seconds() == 0);
    CHECK(deployment.CheckTargets(seed).empty());
  }
}

TEST_CASE("a rank that lacks one of its shards: the sync is refused, naming it, and no target byte changes") {
  Cluster cluster(ClusterOptions{});
  Deployment deployment(cluster, "missing", ModelJson(3, kLayouts[0].replicas), 7, /*extra_rank=*/2,
                        "--drop-tensor up");
  RequireReady(deployment);
  const Contents before = deployment.ReadTargets();
  auto sync = SyncOnce(cluster, absl::Seconds(20));
  REQUIRE_FALSE(sync.ok());
  CHECK(absl::IsFailedPrecondition(sync.status()));
  CHECK_THAT(std::string(sync.status().message()),
             Contains("tensor 'up'") && Contains("no byte moved") && Contains("rank 2") && Contains("has no source"));
  CHECK(deployment.ReadTargets() == before);
}

TEST_CASE("one agent refusing at Prepare stops every agent: nothing is written anywhere") {
  ClusterOptions options;
  options.staging_bytes = 8192;
  options.agent_max_staging_bytes[3] = 4096;  // rank 3 will refuse the budget
  Cluster cluster(options);
  Deployment deployment(cluster, "refuse", ModelJson(3, kLayouts[1].replicas), 9);
  RequireReady(deployment);
  const Contents before = deployment.ReadTargets();
  auto sync = SyncOnce(cluster, absl::Seconds(20));
  REQUIRE_FALSE(sync.ok());
  CHECK_THAT(std::string(sync.status().message()), Contains("rank 3 refused") && Contains("staging budget"));
  CHECK_THAT(std::string(sync.status().message()), !Contains("rank 0 refused"));
  CHECK(deployment.ReadTargets() == before);
}

TEST_CASE("a staging budget smaller than a parameter syncs exactly and stays within the budget") {
  ClusterOptions options;
  options.direct = "never";                           // the staged path
  options.staging_bytes = planner::kMinStagingBytes;  // chunks of 1 KiB; a parameter here is up to 3,200 bytes
  Cluster cluster(options);
  Deployment deployment(cluster, "small-staging", ModelJson(3, kLayouts[0].replicas), 11);
  RequireReady(deployment);
  auto sync = SyncOnce(cluster, absl::Seconds(30));
  REQUIRE(sync.ok());
  CHECK(deployment.CheckTargets(11).empty());
  for (const v1::RankStats& r : sync->ranks()) {
    CHECK(r.peak_peer_staging_bytes() <= planner::kMinStagingBytes);
    CHECK(r.peak_peer_staging_bytes() > 0);
    CHECK(r.peak_staging_bytes() <= planner::kMinStagingBytes * 3);  // 3 peers at once
    CHECK(r.rounds() > 1);
  }
}

TEST_CASE("chunks of several Transfer pieces each arrive whole and exact over the agents' channels") {
  ClusterOptions options;
  options.agents = 2;
  options.direct = "never";                   // the staged path: the host transport between the agents
  options.staging_bytes = int64_t{16} << 20;  // chunks up to 4 MiB: four pieces
  Cluster cluster(options);
  // 16 MiB of bfloat16, ZeRO-3 over both ranks into one TP=2 replica: each rank sends
  // the other a quarter of it.
  Deployment deployment(cluster, "pieces", R"({"model": {"tensors": [
      {"name": "big", "shape": [2048, 2048], "style": "COLUMN"},
      {"name": "wide", "shape": [2048, 2048], "style": "ROW"}],
    "zero_stage": 3, "dp_ranks": [0, 1], "replicas": [{"ranks": [0, 1]}]}})",
                        41);
  RequireReady(deployment);
  for (uint64_t seed : {41, 42}) {
    if (seed != 41) deployment.Refill(seed);
    auto sync = SyncOnce(cluster, absl::Seconds(60));
    REQUIRE(sync.ok());
    CHECK(deployment.CheckTargets(seed).empty());
    for (const v1::RankStats& r : sync->ranks()) {
      REQUIRE(r.rounds() > 0);
      CHECK(r.staged_sent_bytes() == r.sent_bytes());
      CHECK(r.sent_bytes() / r.rounds() >= 2 * executor::kPieceBytes);  // a chunk a round, each two pieces or more
    }
  }
}

TEST_CASE("while a sync runs, the coordinator's status shows each rank's progress; a stopped agent's is blank") {
  constexpr int kStallRound = 8;
  ClusterOptions options;
  options.direct = "never";
  options.staging_bytes = planner::kMinStagingBytes;  // slots of 1 KiB: many rounds
  options.rpc_deadline_ms = 1000;
  // Rank 1's second sync stalls at kStallRound until the sync is aborted.
  options.agent_flags[1] = {"--fault-stall-at-round", std::to_string(kStallRound), "--fault-stall-sync", "2"};
  Cluster cluster(options);
  Deployment deployment(cluster, "progress", ManyRoundsModelJson(), 31);
  RequireReady(deployment);
  REQUIRE(SyncOnce(cluster, absl::Seconds(60)).ok());
  deployment.Refill(32);

  absl::StatusOr<v1::SyncResponse> result = absl::UnknownError("not run");
  std::thread syncer([&] { result = SyncOnce(cluster, absl::Seconds(60)); });
  const bool stalled =
      WaitForLogLine(cluster.agent(1).log_path(), absl::StrCat(" stalls at round ", kStallRound), absl::Seconds(30));
  // Agent 2 stopped: its answer is missing, and the status does not wait it out.
  const bool stopped = cluster.agent(2).Stop(absl::Seconds(10));
  auto status = cluster.coordinator_client().Status(absl::Seconds(5));
  cluster.agent(2).Signal(SIGCONT);
  cluster.agent(1).Signal(SIGKILL);  // ends the stalled sync: the others are aborted
  syncer.join();
  REQUIRE(stalled);
  REQUIRE(stopped);
  REQUIRE(status.ok());
  REQUIRE_FALSE(status->running_sync_id().empty());
  std::map<int32_t, v1::RankProgress> progress;
  for (const v1::RankProgress& p : status->progress()) progress[p.rank()] = p;
  REQUIRE(progress.size() == 4);
  const v1::RankProgress& stalled_rank = progress.at(1);
  CHECK(stalled_rank.sync_id() == status->running_sync_id());
  CHECK(stalled_rank.rounds_done() > 0);
  CHECK(stalled_rank.rounds_done() <= kStallRound);
  CHECK(stalled_rank.rounds_done() < stalled_rank.rounds_total());
  CHECK(stalled_rank.bytes_done() < stalled_rank.bytes_total());
  CHECK(progress.at(2).sync_id().empty());  // no answer
  CHECK(progress.at(2).rounds_total() == 0);
  REQUIRE_FALSE(result.ok());
  CHECK_THAT(std::string(result.status().message()), Contains("rank 1"));

  RestartAgent(cluster, deployment, 1);
  auto again = SyncOnce(cluster, absl::Seconds(60));
  INFO(again.status().message());
  REQUIRE(again.ok());
  CHECK(deployment.CheckTargets(32).empty());
}

TEST_CASE("a stalled agent fails the sync within the deadline, naming it; it syncs again once it resumes") {
  ClusterOptions options;
  options.rpc_deadline_ms = 1000;
  options.sync_timeout_ms = 2000;
  Cluster cluster(options);
  Deployment deployment(cluster, "stall", ModelJson(3, kLayouts[1].replicas), 13);
  RequireReady(deployment);
  REQUIRE(cluster.agent(1).Stop(absl::Seconds(10)));
  const absl::Time start = absl::Now();
  auto sync = SyncOnce(cluster, absl::Seconds(120));  // the coordinator's 2 s end it, not this
  const absl::Duration took = absl::Now() - start;
  cluster.agent(1).Signal(SIGCONT);
  REQUIRE_FALSE(sync.ok());
  CHECK_THAT(std::string(sync.status().message()), Contains("rank 1"));
  CHECK(took < absl::Seconds(60));  // only a sync that waits for the stalled agent takes this long
  auto again = SyncOnce(cluster, absl::Seconds(20));
  INFO(again.status().message());
  if (!again.ok()) cluster.DumpLogs();
  REQUIRE(again.ok());
  CHECK(deployment.CheckTargets(13).empty());
}

TEST_CASE("an agent's unix socket is owner and group only (0660), so only that group may register") {
  Cluster cluster(ClusterOptions{});
  struct stat info {};
  REQUIRE(stat(cluster.socket(0).c_str(), &info) == 0);
  CHECK(S_ISSOCK(info.st_mode));
  CHECK((info.st_mode & 0777) == 0660);

  // --socket replaces only a stale socket: never a regular file, nor a socket in use.
  const std::string file = cluster.socket_dir() + "/not-a-socket";  // a path an agent may bind
  std::ofstream(file) << "keep me";
  for (const std::string& path : {file, cluster.socket(0)}) {
    std::vector<std::string> argv = {"daemon/agent/shardsync-agent", "--rank",   "3", "--coordinator",
                                     cluster.coordinator(),          "--socket", path};
    for (const std::string& flag : cluster.security_flags()) argv.push_back(flag);
    Process agent(argv, cluster.dir() + "/second-agent.log");
    INFO(path);
    CHECK(agent.Wait(absl::Seconds(20)) == 1);
    std::ifstream log(cluster.dir() + "/second-agent.log");
    CHECK_THAT(std::string(std::istreambuf_iterator<char>(log), std::istreambuf_iterator<char>()),
               Contains(path == file ? "is not a socket" : "another process serves the socket"));
  }
  std::ifstream kept(file);
  CHECK(std::string(std::istreambuf_iterator<char>(kept), std::istreambuf_iterator<char>()) == "keep me");
  REQUIRE(stat(cluster.socket(0).c_str(), &info) == 0);  // the serving agent's socket is still there
}

TEST_CASE("a client process that dies has its registrations dropped; a sync that needed them is refused") {
  Cluster cluster(ClusterOptions{});
  Deployment deployment(cluster, "client-dies", ModelJson(3, kLayouts[0].replicas), 15);
  RequireReady(deployment);
  REQUIRE(SyncOnce(cluster, absl::Seconds(20)).ok());
  deployment.trainer(1).Signal(SIGKILL);
  deployment.trainer(1).Wait(absl::Seconds(5));
  client::AgentClient agent(cluster.socket(1));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  int sources = 1;
  while (sources > 0 && absl::Now() < deadline) {
    auto status = agent.Status(absl::Seconds(1));
    REQUIRE(status.ok());
    sources = 0;
    for (const v1::ClientInfo& c : status->clients()) sources += c.role() == v1::SOURCE;
    absl::SleepFor(absl::Milliseconds(10));
  }
  CHECK(sources == 0);
  const Contents before = deployment.ReadTargets();
  auto sync = SyncOnce(cluster, absl::Seconds(20));
  REQUIRE_FALSE(sync.ok());
  CHECK_THAT(std::string(sync.status().message()), Contains("no byte moved") && Contains("by none of rank 1"));
  CHECK(deployment.ReadTargets() == before);
}

TEST_CASE("the coordinator killed and restarted: agents rejoin and republish on their own; the next sync works") {
  Cluster cluster(ClusterOptions{});
  Deployment deployment(cluster, "restart", ModelJson(3, kLayouts[0].replicas), 19);
  RequireReady(deployment);
  REQUIRE(SyncOnce(cluster, absl::Seconds(20)).ok());
  deployment.Refill(20);
  cluster.RestartCoordinator();
  // Nobody re-registers: the agents find the new coordinator and publish again.
  client::CoordinatorClient coordinator = cluster.coordinator_client();
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  absl::StatusOr<v1::SyncResponse> sync = absl::UnavailableError("not tried");
  while (!sync.ok() && absl::Now() < deadline) {
    sync = SyncOnce(cluster, absl::Seconds(20));
    if (!sync.ok()) absl::SleepFor(absl::Milliseconds(100));
  }
  REQUIRE(sync.ok());
  CHECK(deployment.CheckTargets(20).empty());
}

TEST_CASE("both daemons answer the standard health check and serve Prometheus metrics that count the syncs") {
  ClusterOptions options;
  options.metrics = true;
  Cluster cluster(options);
  Deployment deployment(cluster, "metrics", ModelJson(3, kLayouts[0].replicas), 21);
  RequireReady(deployment);
  REQUIRE(SyncOnce(cluster, absl::Seconds(20)).ok());

  const std::string coordinator = HttpGet(cluster.MetricsPort(-1), "/metrics");
  CHECK_THAT(coordinator, StartsWith("HTTP/1.0 200 OK"));
  CHECK_THAT(coordinator, Contains("shardsync_syncs_started_total 1\n") &&
                              Contains("shardsync_syncs_succeeded_total 1\n") &&
                              Contains("shardsync_syncs_failed_total 0\n") &&
                              Contains("shardsync_sync_duration_seconds_count 1\n") &&
                              Contains("shardsync_sync_duration_seconds_bucket{le=\"+Inf\"} 1\n") &&
                              Contains("shardsync_last_sync_version 1\n") && Contains("shardsync_agents 4\n") &&
                              Contains("shardsync_registered_buffers 8\n"));
  const std::string agent = HttpGet(cluster.MetricsPort(0), "/metrics");
  CHECK_THAT(agent, Contains("shardsync_agent_clients 2\n") && Contains("shardsync_agent_registered_buffers 2\n") &&
                        Contains("shardsync_agent_syncs_executed_total 1\n") &&
                        Contains("shardsync_agent_target_valid 1\n"));
  CHECK_THAT(HttpGet(cluster.MetricsPort(-1), "/other"), StartsWith("HTTP/1.0 404"));

  // 100 idle connections (more than the server keeps waiting) do not delay a scrape.
  std::vector<int> idle;
  for (int i = 0; i < 100; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(cluster.MetricsPort(-1)));
    inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
    REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
    idle.push_back(fd);
  }
  // A server that waited on them in turn would never answer (HttpGet gives up after 30 s).
  CHECK_THAT(HttpGet(cluster.MetricsPort(-1), "/metrics"), StartsWith("HTTP/1.0 200 OK"));
  // The server cuts every idle connection: each reads its end, not a hang.
  for (int fd : idle) {
    timeval patience{30, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof(patience));
    char byte = 0;
    CHECK(recv(fd, &byte, 1, 0) == 0);
    close(fd);
  }

  auto status = cluster.coordinator_client().Status(absl::Seconds(5));
  REQUIRE(status.ok());
  std::vector<std::string> addresses = {cluster.coordinator()};
  for (const v1::AgentInfo& a : status->agents()) addresses.push_back(a.address());
  for (const std::string& address : addresses) {
    auto health = grpc::health::v1::Health::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    grpc::health::v1::HealthCheckResponse response;
    const grpc::Status checked = health->Check(&context, grpc::health::v1::HealthCheckRequest(), &response);
    INFO(address << ": " << checked.error_message());
    CHECK(checked.ok());
    CHECK(response.status() == grpc::health::v1::HealthCheckResponse::SERVING);
  }
}

// Runs shardsyncctl with `args`; returns (exit code, stdout and, on failure, stderr).
std::pair<int, std::string> Ctl(const Cluster& cluster, std::vector<std::string> args);

// A model that the smallest staging budget syncs in over a hundred rounds.
TEST_CASE("an agent killed during a sync fails it naming the rank, targets turn invalid; restarted, it syncs again") {
  constexpr int kStallRound = 8;
  ClusterOptions options;
  options.direct = "never";                           // the staged path (the direct path's case is below)
  options.staging_bytes = planner::kMinStagingBytes;  // slots of 1 KiB: many rounds
  options.sync_timeout_ms = 5000;
  // Rank 1's transport stalls its second sync at kStallRound (the first makes every target
  // valid): the kill lands there, after rounds that wrote targets. Its restart has no fault.
  options.agent_flags[1] = {"--fault-stall-at-round", std::to_string(kStallRound), "--fault-stall-sync", "2"};
  Cluster cluster(options);
  Deployment deployment(cluster, "killed", ManyRoundsModelJson(), 25);
  RequireReady(deployment);
  auto first = SyncOnce(cluster, absl::Seconds(60));
  REQUIRE(first.ok());
  for (const v1::RankStats& r : first->ranks()) {
    if (r.rank() == 1) REQUIRE(r.rounds() > 2 * kStallRound);  // the stall is well inside rank 1's sync
  }
  deployment.Refill(26);

  absl::StatusOr<v1::SyncResponse> result = absl::UnknownError("not run");
  std::thread syncer([&] { result = SyncOnce(cluster, absl::Seconds(60)); });
  const bool stalled =
      WaitForLogLine(cluster.agent(1).log_path(), absl::StrCat(" stalls at round ", kStallRound), absl::Seconds(30));
  // Part way through: rank 1's targets hold some of the new values, not all of them.
  const bool partly_written =
      stalled && !deployment.CheckTargets(25, {1}).empty() && !deployment.CheckTargets(26, {1}).empty();
  cluster.agent(1).Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  syncer.join();
  REQUIRE(stalled);
  CHECK(partly_written);
  REQUIRE_FALSE(result.ok());
  CHECK(absl::Now() - killed < absl::Seconds(30));  // the 5 s sync deadline, not the client's 60 s
  CHECK_THAT(std::string(result.status().message()), Contains("rank 1"));
  client::CoordinatorClient coordinator = cluster.coordinator_client();
  auto invalid = coordinator.Status(absl::Seconds(5));
  REQUIRE(invalid.ok());
  CHECK_FALSE(invalid->targets_valid());
  CHECK(Ranks(invalid->invalid_target_ranks()) == std::vector<int32_t>{0, 1, 2, 3});

  // A restarted coordinator remembers nothing, and still calls no half-written target
  // valid: the agents say theirs are invalid when they join it again.
  cluster.RestartCoordinator();
  std::vector<int32_t> said_invalid;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(15); absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(100))) {
    auto restarted = coordinator.Status(absl::Seconds(5));
    if (!restarted.ok() || restarted->agents_size() < 3) continue;
    said_invalid = Ranks(restarted->invalid_target_ranks());
    if (said_invalid.size() == 3) break;
  }
  CHECK(said_invalid == std::vector<int32_t>{0, 2, 3});  // rank 1's agent is gone, with its targets

  RestartAgent(cluster, deployment, 1);
  // Writing rank 1's targets alone leaves the others invalid, and says so.
  auto [partial_code, partial] = Ctl(cluster, {"sync", "--target-ranks", "1"});
  INFO(partial);
  REQUIRE(partial_code == 0);
  CHECK_THAT(partial, Contains("other targets: INVALID on rank 0, rank 2, rank 3"));
  CHECK(deployment.CheckTargets(26, {1}).empty());
  auto still_invalid = coordinator.Status(absl::Seconds(5));
  REQUIRE(still_invalid.ok());
  CHECK_FALSE(still_invalid->targets_valid());
  CHECK(Ranks(still_invalid->invalid_target_ranks()) == std::vector<int32_t>{0, 2, 3});
  // Each rank's targets carry the sync they hold: rank 1 that one, the others none.
  const auto versions = [](const v1::CoordinatorStatus& status) {
    std::map<int32_t, std::string> out;
    for (const v1::AgentInfo& agent : status.agents()) out[agent.rank()] = agent.target_version();
    return out;
  };
  CHECK(versions(*still_invalid) ==
        std::map<int32_t, std::string>{{0, ""}, {1, still_invalid->last_sync_id()}, {2, ""}, {3, ""}});
  client::AgentClient agent0(cluster.socket(0));  // it only read for rank 1: still invalid
  auto agent0_status = agent0.Status(absl::Seconds(5));
  REQUIRE(agent0_status.ok());
  CHECK_FALSE(agent0_status->target_valid());
  CHECK(agent0_status->target_version().empty());
  auto again = SyncOnce(cluster, absl::Seconds(60));
  INFO(again.status().message());
  REQUIRE(again.ok());
  CHECK(deployment.CheckTargets(26).empty());
  auto valid = coordinator.Status(absl::Seconds(5));
  REQUIRE(valid.ok());
  CHECK(valid->targets_valid());
  CHECK(valid->invalid_target_ranks().empty());
  CHECK(versions(*valid) ==
        std::map<int32_t, std::string>{
            {0, again->sync_id()}, {1, again->sync_id()}, {2, again->sync_id()}, {3, again->sync_id()}});
  agent0_status = agent0.Status(absl::Seconds(5));
  REQUIRE(agent0_status.ok());
  CHECK(agent0_status->target_valid());
  CHECK(agent0_status->target_version() == again->sync_id());
  auto [status_code, status_out] = Ctl(cluster, {"status"});
  INFO(status_out);
  CHECK(status_code == 0);
  CHECK_THAT(status_out, Contains("targets hold") && Contains(again->sync_id()));
}

TEST_CASE("an agent killed between syncs: the next sync is refused naming it, every target valid and unchanged") {
  for (const std::string direct : {"auto", "never"}) {
    INFO("--direct " << direct);
    ClusterOptions options;
    options.direct = direct;
    options.sync_timeout_ms = 5000;
    Cluster cluster(options);
    Deployment deployment(cluster, "between", ModelJson(3, kLayouts[0].replicas), 31);
    RequireReady(deployment);
    for (int i = 0; i < 2; ++i) REQUIRE(SyncOnce(cluster, absl::Seconds(60)).ok());
    deployment.Refill(32);
    cluster.agent(2).Signal(SIGKILL);
    cluster.agent(2).Wait(absl::Seconds(5));
    auto sync = SyncOnce(cluster, absl::Seconds(120));
    REQUIRE_FALSE(sync.ok());
    INFO(sync.status().message());
    CHECK(absl::IsFailedPrecondition(sync.status()));
    CHECK_THAT(std::string(sync.status().message()), Contains("refused, no byte moved"));
    CHECK_THAT(std::string(sync.status().message()), Contains("rank 2 did not answer Prepare"));
    auto status = cluster.coordinator_client().Status(absl::Seconds(5));
    REQUIRE(status.ok());
    CHECK(status->targets_valid());
    CHECK(deployment.CheckTargets(31, {0, 1, 3}).empty());  // the last sync's bytes
    RestartAgent(cluster, deployment, 2);
    auto again = SyncOnce(cluster, absl::Seconds(60));
    INFO(again.status().message());
    REQUIRE(again.ok());
    CHECK(deployment.CheckTargets(32).empty());
  }
}

TEST_CASE("the direct path: an agent killed after its copies, before it says done, fails the sync named; then exact") {
  ClusterOptions options;
  options.sync_timeout_ms = 5000;
  // Rank 1 stalls its second sync where it would tell its peers that its direct copies of
  // stage 0 are in their targets (round -2): the peers wait for that word.
  options.agent_flags[1] = {"--fault-stall-at-round", std::to_string(executor::DirectDoneRound(0)),
                            "--fault-stall-sync", "2"};
  Cluster cluster(options);
  Deployment deployment(cluster, "killed-direct", ModelJson(3, kLayouts[1].replicas), 27);
  RequireReady(deployment);
  auto first = SyncOnce(cluster, absl::Seconds(20));
  REQUIRE(first.ok());
  const auto rank1 =
      std::find_if(first->ranks().begin(), first->ranks().end(), [](const v1::RankStats& r) { return r.rank() == 1; });
  REQUIRE(rank1 != first->ranks().end());
  REQUIRE(rank1->direct_sent_bytes() > 0);  // rank 1 writes other ranks' targets directly
  deployment.Refill(28);

  absl::StatusOr<v1::SyncResponse> result = absl::UnknownError("not run");
  std::thread syncer([&] { result = SyncOnce(cluster, absl::Seconds(60)); });
  const bool stalled = WaitForLogLine(cluster.agent(1).log_path(), " stalls at round -2", absl::Seconds(30));
  // Rank 1's copies landed: some target elements hold the new values already.
  const bool some_new = stalled && !deployment.CheckTargets(27).empty();
  cluster.agent(1).Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  syncer.join();
  REQUIRE(stalled);
  CHECK(some_new);
  REQUIRE_FALSE(result.ok());
  CHECK(absl::Now() - killed < absl::Seconds(30));  // the sync deadline, not the client's 60 s
  CHECK_THAT(std::string(result.status().message()), Contains("rank 1"));
  auto invalid = cluster.coordinator_client().Status(absl::Seconds(5));
  REQUIRE(invalid.ok());
  CHECK_FALSE(invalid->targets_valid());

  RestartAgent(cluster, deployment, 1);
  auto again = SyncOnce(cluster, absl::Seconds(20));
  INFO(again.status().message());
  if (!again.ok()) cluster.DumpLogs();
  REQUIRE(again.ok());
  CHECK(deployment.CheckTargets(28).empty());
  auto valid = cluster.coordinator_client().Status(absl::Seconds(5));
  REQUIRE(valid.ok());
  CHECK(valid->targets_valid());
}

// Resident memory (KiB) and open file descriptors of a process, from /proc.
std::pair<int64_t, int64_t> FootprintNow(pid_t pid) {
  int64_t rss = 0, fds = 0;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) rss = std::stoll(line.substr(6));
  }
  for (const auto& entry : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
    (void)entry;
    ++fds;
  }
  return {rss, fds};
}

// The same, settled: the fewest descriptors over 200 ms, since a client's connection
// that just closed may linger a moment (each sync here is a new client channel).
std::pair<int64_t, int64_t> Footprint(pid_t pid) {
  std::pair<int64_t, int64_t> settled = FootprintNow(pid);
  for (int i = 0; i < 10; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
    const auto now = FootprintNow(pid);
    settled = {now.first, std::min(settled.second, now.second)};
  }
  return settled;
}

TEST_CASE("1,000 syncs with changing sources all verify; the daemons' memory and descriptors stay flat", "[rss]") {
  Cluster cluster(ClusterOptions{});
  Deployment deployment(cluster, "soak", ModelJson(3, kLayouts[0].replicas), 2000);
  RequireReady(deployment);
  std::vector<pid_t> daemons = {cluster.coordinator_process().pid()};
  for (int rank = 0; rank < 4; ++rank) daemons.push_back(cluster.agent(rank).pid());
  const auto step = [&](uint64_t seed) {
    deployment.Refill(seed);
    auto sync = SyncOnce(cluster, absl::Seconds(20));
    return sync.ok() && deployment.CheckTargets(seed).empty();
  };
  for (uint64_t seed = 1; seed <= 50; ++seed) REQUIRE(step(seed));  // warm-up
  std::vector<std::pair<int64_t, int64_t>> before;
  for (pid_t pid : daemons) before.push_back(Footprint(pid));
  int verified = 0;
  for (uint64_t seed = 100; seed < 1100; ++seed) verified += step(seed);
  CHECK(verified == 1000);
  for (size_t i = 0; i < daemons.size(); ++i) {
    const auto after = Footprint(daemons[i]);
    std::printf("soak: %s: RSS %lld -> %lld KiB, fds %lld -> %lld\n",
                i == 0 ? "coordinator" : ("agent " + std::to_string(i - 1)).c_str(),
                static_cast<long long>(before[i].first), static_cast<long long>(after.first),
                static_cast<long long>(before[i].second), static_cast<long long>(after.second));
    CHECK(after.first - before[i].first < 4096);  // KiB
    CHECK(after.second <= before[i].second);      // no descriptor leaks
  }
}

// Runs shardsyncctl with `args` alone; returns (exit code, stdout and, on failure, stderr).
std::pair<int, std::string> CtlOffline(const Cluster& cluster, std::vector<std::string> args) {
  std::vector<std::string> argv = {"client/cli/shardsyncctl"};
  argv.insert(argv.end(), args.begin(), args.end());
  const std::string log = cluster.dir() + "/ctl.log";
  unlink(log.c_str());
  Process ctl(argv, log);
  std::string out = ctl.ReadAll(absl::Seconds(90));  // hang deadlines: a call takes seconds
  const int code = ctl.Wait(absl::Seconds(30));
  if (code != 0) {  // what it said on stderr, for the failure report
    std::ifstream file(log);
    out += std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
  }
  return {code, out};
}

std::pair<int, std::string> Ctl(const Cluster& cluster, std::vector<std::string> args) {
  args.push_back("--coordinator");
  args.push_back(cluster.coordinator());
  for (const std::string& flag : cluster.security_flags()) args.push_back(flag);
  return CtlOffline(cluster, std::move(args));
}

// The names of the top-level fields of the JSON object `json`.
std::set<std::string> JsonFieldNames(const std::string& json) {
  google::protobuf::Struct parsed;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &parsed);
  INFO(status.ToString() << ": " << json);
  REQUIRE(status.ok());
  std::set<std::string> names;
  for (const auto& [name, value] : parsed.fields()) names.insert(name);
  return names;
}

TEST_CASE("shardsyncctl syncs, explains and reports status, with documented exit codes") {
  Cluster cluster(ClusterOptions{});
  {
    Deployment deployment(cluster, "ctl", ModelJson(3, kLayouts[0].replicas), 17);
    RequireReady(deployment);
    auto [explain_code, explain] = Ctl(cluster, {"explain", "--json", "--links"});
    CHECK(explain_code == 0);
    CHECK_THAT(explain, Contains("\"floor_seconds\"") && Contains("\"links\":[{"));
    CHECK_THAT(Ctl(cluster, {"explain", "--json"}).second, Contains("\"links\":[]"));  // only when asked
    // plan, offline, prints the report explain prints: the same fields, the same plan.
    const std::string spec = cluster.dir() + "/ctl-offline.json";
    std::ofstream(spec) << ModelJson(3, kLayouts[0].replicas);
    auto [plan_code, plan] = CtlOffline(cluster, {"plan", "--spec", spec, "--staging-bytes",
                                                  std::to_string(ClusterOptions{}.staging_bytes), "--json", "--links"});
    REQUIRE(plan_code == 0);
    CHECK(JsonFieldNames(plan) == JsonFieldNames(explain));
    v1::ExplainResponse offline, online;
    REQUIRE(google::protobuf::util::JsonStringToMessage(plan, &offline).ok());
    REQUIRE(google::protobuf::util::JsonStringToMessage(explain, &online).ok());
    CHECK(offline.layout_epoch() == 0);  // no coordinator's epoch offline
    online.clear_layout_epoch();
    // The digest covers buffer ids, which the spec file and the clients' registrations number apart.
    CHECK(offline.digest().size() == online.digest().size());
    offline.clear_digest();
    online.clear_digest();
    // The coordinator knows its agents: every link here is direct (one host).
    for (v1::LinkBytes& link : *online.mutable_links()) {
      CHECK(link.path() == v1::DIRECT);
      link.clear_path();
    }
    for (v1::RankStats& rank : *online.mutable_ranks()) {
      CHECK(rank.direct_sent_bytes() == rank.sent_bytes());
      CHECK(rank.staged_sent_bytes() == 0);
      rank.clear_direct_sent_bytes();
      rank.clear_direct_received_bytes();
    }
    CHECK(offline.DebugString() == online.DebugString());
    auto [sync_code, table] = Ctl(cluster, {"sync"});
    CHECK(sync_code == 0);
    CHECK_THAT(table, Contains("rank") && Contains("received") && Contains("GB/s") && Contains("total") &&
                          Contains(" direct (written in place, no staging), 0 B staged"));
    CHECK(deployment.CheckTargets(17).empty());
    auto [status_code, status] = Ctl(cluster, {"status"});
    CHECK(status_code == 0);
    CHECK_THAT(status, Contains("4 of 4 agents joined") && Contains("ok"));
    auto [json_code, json] = Ctl(cluster, {"sync", "--json"});
    CHECK(json_code == 0);
    CHECK_THAT(json, Contains("\"sync_id\"") && Contains("\"ranks\""));
    CHECK_THAT(json, Contains("\"links\":[]"));  // a million at 1,024 ranks: only when asked
    auto [links_code, links] = Ctl(cluster, {"sync", "--links", "--json"});
    CHECK(links_code == 0);
    CHECK_THAT(links, Contains("\"links\"") && Contains("\"from_rank\""));
    auto [linked_code, linked] = Ctl(cluster, {"sync", "--links"});
    CHECK(linked_code == 0);
    CHECK_THAT(linked, Contains("links (from -> to: bytes, path)") && Contains(", direct\n"));
    auto [partial_code, partial] = Ctl(cluster, {"sync", "--target-ranks", "1,3"});
    CHECK(partial_code == 0);
    CHECK_THAT(partial, Contains("targets written on rank 1, rank 3\n"));
    auto [explained_code, explained] = Ctl(cluster, {"explain", "--target-ranks", "2"});
    CHECK(explained_code == 0);
    CHECK_THAT(explained, Contains("plan of epoch"));
    CHECK(Ctl(cluster, {"sync", "--target-ranks", "9"}).first == 3);  // outside the world: refused
    CHECK(Ctl(cluster, {"sync", "--target-ranks", "one"}).first == 2);
    CHECK(Ctl(cluster, {"status", "--target-ranks", "1"}).first == 2);
  }
  // Nothing registered now: refused (3). A bad flag: usage (2).
  auto [refused_code, refused] = Ctl(cluster, {"sync"});
  CHECK(refused_code == 3);
  CHECK(Ctl(cluster, {"sync", "--bogus"}).first == 2);
  CHECK(Ctl(cluster, {"status", "--watch"}).first == 2);
}

TEST_CASE("a stalled agent fails shardsyncctl's sync at the coordinator's deadlines; unreachable is exit 5") {
  ClusterOptions options;
  options.rpc_deadline_ms = 1000;
  options.sync_timeout_ms = 2000;
  Cluster cluster(options);
  Deployment deployment(cluster, "deadline", ModelJson(3, kLayouts[1].replicas), 19);
  RequireReady(deployment);
  REQUIRE(cluster.agent(2).Stop(absl::Seconds(10)));
  const absl::Time start = absl::Now();
  auto [code, said] = Ctl(cluster, {"sync", "--timeout-ms", "120000"});  // more than the coordinator allows
  const absl::Duration took = absl::Now() - start;
  cluster.agent(2).Signal(SIGCONT);
  CHECK(code == 3);  // CPU agents prepare every sync: the stalled one never agreed, nothing moved
  CHECK_THAT(said, Contains("rank 2"));
  CHECK(took < absl::Seconds(60));  // the coordinator's deadlines, not the 120 s asked for
  auto again = SyncOnce(cluster, absl::Seconds(20));
  INFO(again.status().message());
  if (!again.ok()) cluster.DumpLogs();
  REQUIRE(again.ok());

  // Nothing listens on port 1: nothing ran, and the code says so.
  std::vector<std::string> argv = {"client/cli/shardsyncctl", "sync", "--coordinator", "127.0.0.1:1"};
  for (const std::string& flag : cluster.security_flags()) argv.push_back(flag);
  Process unreachable(argv, cluster.dir() + "/unreachable.log");
  CHECK(unreachable.Wait(absl::Seconds(40)) == 5);
  std::ifstream log(cluster.dir() + "/unreachable.log");
  CHECK_THAT(std::string(std::istreambuf_iterator<char>(log), std::istreambuf_iterator<char>()),
             Contains("cannot reach the coordinator") && Contains("nothing ran"));
}

TEST_CASE("shardsyncctl lists agents, explains with imbalance and links, says its version, and watches a sync") {
  ClusterOptions options;
  options.rpc_deadline_ms = 1000;
  Cluster cluster(options);
  Deployment deployment(cluster, "ctl-more", ModelJson(3, kLayouts[1].replicas), 23);
  RequireReady(deployment);
  auto [agents_code, agents] = Ctl(cluster, {"agents"});
  CHECK(agents_code == 0);
  for (int rank = 0; rank < 4; ++rank) CHECK_THAT(agents, Contains(absl::StrCat("\n", rank, "      127.0.0.1:")));
  CHECK_THAT(agents, Contains("joined") && Contains("last seen"));
  auto [explain_code, explain] = Ctl(cluster, {"explain", "--links"});
  CHECK(explain_code == 0);
  CHECK_THAT(explain, Contains("imbalance ") && Contains("links (from -> to: bytes, path)") && Contains("0 -> 1:") &&
                          Contains("direct, no staging"));
  CHECK_THAT(Ctl(cluster, {"explain"}).second, !Contains("links (from"));
  auto [watch_code, watched] = Ctl(cluster, {"sync", "--watch"});
  CHECK(watch_code == 0);
  CHECK_THAT(watched, Contains("watching the sync") && Contains("total"));
  CHECK(deployment.CheckTargets(23).empty());
  // A stalled agent holds the sync for its deadline: --watch reports every rank meanwhile.
  REQUIRE(cluster.agent(3).Stop(absl::Seconds(10)));
  auto [stalled_code, stalled] = Ctl(cluster, {"sync", "--watch", "--timeout-ms", "1500"});
  cluster.agent(3).Signal(SIGCONT);
  INFO(stalled);
  CHECK((stalled_code == 3 || stalled_code == 4));
  CHECK_THAT(stalled, Contains("watching the sync") && Contains("rank 0 ") && Contains("(round "));
  std::vector<std::string> argv = {"client/cli/shardsyncctl", "version"};
  Process version(argv, cluster.dir() + "/version.log");
  CHECK_THAT(version.ReadAll(absl::Seconds(10)), StartsWith("shardsyncctl 0.1.0"));
  CHECK(version.Wait(absl::Seconds(10)) == 0);
  Process version_json({"client/cli/shardsyncctl", "version", "--json"}, cluster.dir() + "/version.log");
  CHECK_THAT(version_json.ReadAll(absl::Seconds(10)),
             Contains("\"version\": \"0.1.0\"") && Contains(absl::StrCat("\"contract\": \"", kContractId, "\"")));
}

}  // namespace
}  // namespace shardsync::localsync
