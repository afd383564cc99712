// Real daemons and clients: sync --verify catches a target that differs from its
// source, concurrent syncs queue, malformed and oversized messages are refused with the
// daemons still serving, an agent writes only into target placements, never into
// sources, and knows which process registered what.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "tools/localsync/deployment.h"

namespace shardsync::localsync {
namespace {

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

// Heads split unevenly, padded vocab (fills), row-parallel, replicated: ZeRO-3 over 4
// ranks into two TP=2 replicas.
constexpr char kModel[] = R"({"model": {"tensors": [
    {"name": "embed", "shape": [100, 16], "style": "VOCAB"},
    {"name": "heads", "shape": [24, 16], "style": "COLUMN", "split_unit": 4},
    {"name": "o_proj", "shape": [16, 24], "style": "ROW", "split_unit": 4},
    {"name": "norm", "shape": [16]},
    {"name": "down", "shape": [16, 40], "style": "ROW"}],
  "zero_stage": 3, "dp_ranks": [0, 1, 2, 3], "replicas": [{"ranks": [0, 1]}, {"ranks": [2, 3]}]}})";

void RequireReady(Deployment& deployment) {
  for (const std::string& line : deployment.WaitReady()) REQUIRE_THAT(line, StartsWith("ready"));
}

TEST_CASE("sync --verify: checksums agree after a sync; a target overwritten during the sync fails it, naming it") {
  Cluster cluster(ClusterOptions{});
  Deployment deployment(cluster, "verify", kModel, 5);
  RequireReady(deployment);
  auto verified = SyncOnce(cluster, absl::Seconds(20), /*verify=*/true);
  INFO(verified.status().message());
  REQUIRE(verified.ok());
  // Every (tensor, target rank): 5 tensors on each of the 4 target ranks.
  CHECK(verified->verified_placements() == 20);
  CHECK(deployment.CheckTargets(5).empty());
  double verify_seconds = 0;
  for (const v1::RankStats& r : verified->ranks()) {
    CHECK(r.verify_seconds() > 0);  // every rank's checksums, reported beside its other stats
    CHECK(r.execute_seconds() > 0);
    verify_seconds = std::max(verify_seconds, r.verify_seconds());
  }
  std::printf("verify: %d placements, sync %.4f s of which checksums %.4f s\n", verified->verified_placements(),
              verified->seconds(), verify_seconds);

  // Rank 2's rollout keeps writing over its first tensor while syncs run. A sync whose
  // write lands after the scribble's last one passes (the bytes are right when checked),
  // so it takes a few tries on a busy machine; any sync that fails must name rank 2.
  Process& rollout = deployment.rollout(2);
  rollout.WriteLine("scribble");
  REQUIRE(rollout.ReadLine(absl::Seconds(10)) == "scribbling");
  absl::StatusOr<v1::SyncResponse> caught = absl::UnknownError("not run");
  int tries = 0;
  while (caught.ok() || tries == 0) {
    caught = SyncOnce(cluster, absl::Seconds(20), /*verify=*/true);
    if (++tries == 100) break;
  }
  rollout.WriteLine("still");
  REQUIRE(rollout.ReadLine(absl::Seconds(10)) == "still");
  std::printf("verify: a scribbled target caught after %d verified sync(s)\n", tries);
  REQUIRE_FALSE(caught.ok());
  CHECK(caught.status().code() == absl::StatusCode::kDataLoss);
  const std::string message(caught.status().message());
  INFO(message);
  CHECK_THAT(message, Contains("verify failed") && Contains("on rank 2") && Contains("1 placement(s)"));
  auto status = cluster.coordinator_client().Status(absl::Seconds(5));
  REQUIRE(status.ok());
  CHECK_FALSE(status->targets_valid());

  // Without verify the same overwrite would have gone unseen; with the writer still, the
  // next verified sync is clean again.
  auto again = SyncOnce(cluster, absl::Seconds(20), /*verify=*/true);
  INFO(again.status().message());
  REQUIRE(again.ok());
  CHECK(deployment.CheckTargets(5).empty());
}

TEST_CASE("syncs asked for at once are queued: each runs alone and all succeed") {
  Cluster cluster(ClusterOptions{});
  Deployment deployment(cluster, "queued", kModel, 9);
  RequireReady(deployment);
  constexpr int kSyncs = 4;
  std::vector<absl::StatusOr<v1::SyncResponse>> results(kSyncs, absl::UnknownError("not run"));
  std::vector<std::thread> callers;
  const absl::Time start = absl::Now();
  for (int i = 0; i < kSyncs; ++i) {
    callers.emplace_back([&, i] { results[i] = SyncOnce(cluster, absl::Seconds(30), /*verify=*/true); });
  }
  for (std::thread& t : callers) t.join();
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  double busy = 0;
  std::set<std::string> ids;
  for (const auto& r : results) {
    INFO(r.status().message());
    REQUIRE(r.ok());
    busy += r->seconds();  // from the moment this sync got its turn
    ids.insert(r->sync_id());
  }
  CHECK(ids.size() == kSyncs);
  CHECK(busy <= wall);  // one after another: their running times do not overlap
  CHECK(deployment.CheckTargets(9).empty());
}

// Calls `method` with `bytes` that are not a protobuf message of its request type.
grpc::Status CallWithGarbage(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                             const std::string& bytes) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::mutex mu;
  std::condition_variable done_cv;
  bool done = false;
  grpc::Status result;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response, [&](grpc::Status status) {
    std::lock_guard<std::mutex> lock(mu);
    result = status;
    done = true;
    done_cv.notify_one();
  });
  std::unique_lock<std::mutex> lock(mu);
  done_cv.wait(lock, [&] { return done; });
  return result;
}

TEST_CASE("malformed protobuf on every service is refused; the daemons keep serving and the next sync is exact") {
  ClusterOptions options;
  options.agents = 4;
  Cluster cluster(options);
  Deployment deployment(cluster, "malformed", kModel, 13);
  RequireReady(deployment);
  const auto coordinator = grpc::CreateChannel(cluster.coordinator(), grpc::InsecureChannelCredentials());
  const auto agent_socket = grpc::CreateChannel("unix:" + cluster.socket(1), grpc::InsecureChannelCredentials());
  // Truncated varints, a length past the end, a wrong wire type, random bytes.
  const std::vector<std::string> garbage = {std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 10),
                                            std::string("\x0a\x7f"
                                                        "abc",
                                                        5),
                                            std::string("\x0f\x01", 2), std::string("\x12\xff\xff\xff\xff\x0f", 6)};
  const std::vector<std::pair<const std::shared_ptr<grpc::Channel>*, std::string>> methods = {
      {&coordinator, "/shardsync.v1.Coordinator/Join"},
      {&coordinator, "/shardsync.v1.Coordinator/Publish"},
      {&coordinator, "/shardsync.v1.Coordinator/Sync"},
      {&coordinator, "/shardsync.v1.Coordinator/Explain"},
      {&agent_socket, "/shardsync.v1.Agent/Status"}};
  int refused = 0;
  for (const auto& [channel, method] : methods) {
    for (const std::string& bytes : garbage) {
      const grpc::Status status = CallWithGarbage(*channel, method, bytes);
      INFO(method << ": " << status.error_code() << " " << status.error_message());
      CHECK_FALSE(status.ok());
      refused += !status.ok();
    }
  }
  std::printf("malformed: %d of %zu calls refused\n", refused, methods.size() * garbage.size());
  auto sync = SyncOnce(cluster, absl::Seconds(20), /*verify=*/true);
  INFO(sync.status().message());
  REQUIRE(sync.ok());
  CHECK(deployment.CheckTargets(13).empty());
}

// One small tensor, ZeRO-3 over two ranks into one TP2 replica on them.
constexpr char kTwoRankModel[] = R"({"model": {"tensors": [{"name": "w", "shape": [64, 8]}],
    "zero_stage": 3, "dp_ranks": [0, 1], "replicas": [{"ranks": [0, 1]}]}})";

TEST_CASE("a chunk for a sync the agent has not prepared is refused at once, not held") {
  ClusterOptions options;
  options.agents = 2;
  Cluster cluster(options);
  Deployment deployment(cluster, "transfer", kTwoRankModel, 5);
  RequireReady(deployment);
  auto status = cluster.coordinator_client().Status(absl::Seconds(5));
  REQUIRE(status.ok());
  REQUIRE(status->agents_size() == 2);
  auto stub =
      v1::AgentControl::NewStub(grpc::CreateChannel(status->agents(1).address(), grpc::InsecureChannelCredentials()));
  v1::TransferRequest transfer;
  transfer.set_sync_id("sync-nobody-prepared");
  transfer.set_from_rank(0);
  transfer.set_data(std::string(1 << 20, 'x'));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::hours(1));  // would park it for an hour
  v1::TransferResponse response;
  const absl::Time start = absl::Now();
  const grpc::Status refused = stub->Transfer(&context, transfer, &response);
  CHECK(refused.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK_THAT(refused.error_message(), Contains("has prepared no sync 'sync-nobody-prepared'"));
  CHECK(absl::Now() - start < absl::Minutes(10));                     // refused, not parked for the hour asked
  auto sync = SyncOnce(cluster, absl::Seconds(20), /*verify=*/true);  // real chunks still go through
  INFO(sync.status().message());
  REQUIRE(sync.ok());
  CHECK(deployment.CheckTargets(5).empty());
}

TEST_CASE("a message over a server's limit is refused; the daemons keep serving") {
  ClusterOptions options;
  options.agents = 2;
  Cluster cluster(options);
  Deployment deployment(cluster, "limits", kTwoRankModel, 3);
  RequireReady(deployment);
  const std::string big((64 << 20) + 1024, 'x');  // just over 64 MiB: the default limit of both
  const grpc::Status coordinator =
      CallWithGarbage(grpc::CreateChannel(cluster.coordinator(), grpc::InsecureChannelCredentials()),
                      "/shardsync.v1.Coordinator/Publish", big);
  INFO(coordinator.error_message());
  CHECK(coordinator.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  const grpc::Status agent =
      CallWithGarbage(grpc::CreateChannel("unix:" + cluster.socket(0), grpc::InsecureChannelCredentials()),
                      "/shardsync.v1.Agent/Status", big);
  INFO(agent.error_message());
  CHECK(agent.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  auto sync = SyncOnce(cluster, absl::Seconds(20), /*verify=*/true);
  INFO(sync.status().message());
  REQUIRE(sync.ok());
  CHECK(deployment.CheckTargets(3).empty());
}

TEST_CASE("an agent writes only target placements: sources and every byte outside the placements stay as they were") {
  Cluster cluster(ClusterOptions{});
  Deployment deployment(cluster, "writes", kModel, 21);
  RequireReady(deployment);
  for (uint64_t seed : {21, 22, 23}) {
    if (seed != 21) deployment.Refill(seed);
    auto sync = SyncOnce(cluster, absl::Seconds(20));
    INFO(sync.status().message());
    REQUIRE(sync.ok());
    const std::vector<std::string> sources = deployment.CheckSources(seed);
    INFO((sources.empty() ? "" : sources.front()));
    CHECK(sources.empty());
    // The arena's gaps keep their poison: CheckTargets compares every byte of it.
    CHECK(deployment.CheckTargets(seed).empty());
  }
}

TEST_CASE("the agent knows who registered: each client's pid and uid, from the unix socket") {
  Cluster cluster(ClusterOptions{});
  Deployment deployment(cluster, "peers", kModel, 31);
  RequireReady(deployment);
  for (int rank = 0; rank < 4; ++rank) {
    auto status = client::AgentClient(cluster.socket(rank)).Status(absl::Seconds(5));
    REQUIRE(status.ok());
    std::set<int32_t> pids;
    for (const v1::ClientInfo& c : status->clients()) {
      CHECK(c.uid() == getuid());
      pids.insert(c.pid());
    }
    CHECK(pids == std::set<int32_t>{deployment.trainer(rank).pid(), deployment.rollout(rank).pid()});
  }
}

}  // namespace
}  // namespace shardsync::localsync
