// Which links take the direct path, from the agents' joins alone.
#include "daemon/coordinator/link_paths.h"

#include <catch2/catch.hpp>

namespace shardsync::coordinator {
namespace {

using Catch::Matchers::Contains;

v1::JoinRequest Agent(const std::string& host, const std::string& uuid, std::vector<std::string> peers = {}) {
  v1::JoinRequest join;
  join.set_host(host);
  join.set_node(host);
  join.set_device(uuid.empty() ? "cpu" : "cuda:0");
  join.set_device_uuid(uuid);
  for (const std::string& peer : peers) join.add_peer_device_uuids(peer);
  return join;
}

TEST_CASE("agents on one GPU, on host memory of one host, or on GPUs with peer access link directly") {
  const std::vector<v1::JoinRequest> one_gpu(4, Agent("h", "GPU-a"));
  auto paths = ChooseLinkPaths(one_gpu, DirectMode::kAuto);
  REQUIRE(paths.ok());
  CHECK(paths->DirectPeers(2) == std::vector<int32_t>{0, 1, 3});
  CHECK_FALSE(paths->needs_communicator);
  CHECK(paths->Path(0, 3) == v1::DIRECT);

  paths = ChooseLinkPaths({Agent("h", ""), Agent("h", ""), Agent("g", "")}, DirectMode::kAuto);
  REQUIRE(paths.ok());
  CHECK(paths->Direct(0, 1));
  CHECK_FALSE(paths->Direct(0, 2));  // another host: the transport
  CHECK_FALSE(paths->needs_communicator);

  // Peer access both ways: direct. One way only, or none: NCCL.
  paths = ChooseLinkPaths({Agent("h", "GPU-a", {"GPU-b"}), Agent("h", "GPU-b", {"GPU-a"}), Agent("h", "GPU-c")},
                          DirectMode::kAuto);
  REQUIRE(paths.ok());
  CHECK(paths->Direct(0, 1));
  CHECK_FALSE(paths->Direct(0, 2));
  CHECK(paths->needs_communicator);
}

TEST_CASE("never stages every link and refuses agents that share a GPU; always refuses a pair that cannot map") {
  auto paths = ChooseLinkPaths({Agent("h", "GPU-a", {"GPU-b"}), Agent("h", "GPU-b", {"GPU-a"})}, DirectMode::kNever);
  REQUIRE(paths.ok());
  CHECK_FALSE(paths->Direct(0, 1));
  CHECK(paths->needs_communicator);

  paths = ChooseLinkPaths({Agent("h", "GPU-a"), Agent("h", "GPU-a")}, DirectMode::kNever);
  REQUIRE(absl::IsFailedPrecondition(paths.status()));
  CHECK_THAT(std::string(paths.status().message()), Contains("ranks 0 and 1 share CUDA device GPU-a"));

  // Two hosts with two agents on one GPU each: the staged pairs need NCCL, which cannot.
  paths = ChooseLinkPaths({Agent("h", "GPU-a"), Agent("h", "GPU-a"), Agent("g", "GPU-x"), Agent("g", "GPU-x")},
                          DirectMode::kAuto);
  REQUIRE(absl::IsFailedPrecondition(paths.status()));
  CHECK_THAT(std::string(paths.status().message()), Contains("share CUDA device"));

  paths = ChooseLinkPaths({Agent("h", "GPU-a"), Agent("g", "GPU-b")}, DirectMode::kAlways);
  REQUIRE(absl::IsFailedPrecondition(paths.status()));
  CHECK_THAT(std::string(paths.status().message()), Contains("ranks 0 (h, cuda:0) and 1 (g, cuda:0) cannot map"));
}

TEST_CASE("agents send host messages through the signal boards of their own host") {
  std::vector<v1::JoinRequest> joins = {Agent("h", ""), Agent("h", "GPU-a"), Agent("g", ""), Agent("h", "")};
  for (size_t r = 0; r < joins.size(); ++r) {
    joins[r].set_address("a" + std::to_string(r));
    joins[r].set_signal_board("/board-" + std::to_string(r));
  }
  joins[3].clear_signal_board();  // an agent without a board: its channel
  CHECK(SignalBoardsFor(0, joins) == std::map<int32_t, std::string>{{1, "/board-1"}});
  CHECK(SignalBoardsFor(1, joins) == std::map<int32_t, std::string>{{0, "/board-0"}});
  CHECK(SignalBoardsFor(2, joins).empty());                // alone on host g
  CHECK(SignalBoardsFor(3, joins).empty());                // no board of its own: both ways over its channel
  auto paths = ChooseLinkPaths(joins, DirectMode::kAuto);  // kept with the paths, once per membership
  REQUIRE(paths.ok());
  CHECK(paths->signal_boards[0] == SignalBoardsFor(0, joins));
  CHECK(paths->signal_boards[3].empty());
  joins[1].clear_address();  // not joined
  CHECK(SignalBoardsFor(0, joins).empty());
}

}  // namespace
}  // namespace shardsync::coordinator
