// The coordinator's requests are checked at its edge: a rank outside the world, a
// missing or oversized name, an agent of another build, a Publish before a Join, or a
// claimant of another certificate than the rank's is refused and changes nothing.
#include <catch2/catch.hpp>
#include <string>

#include "common/contract_id.h"
#include "common/tls.h"
#include "daemon/coordinator/coordinator.h"

namespace shardsync::coordinator {
namespace {

using Catch::Matchers::Contains;

CoordinatorConfig WorldOf(int32_t world) {
  CoordinatorConfig config;
  config.world_size = world;
  TlsConfig plaintext;
  plaintext.insecure = true;
  config.credentials = *LoadCredentials(plaintext);
  return config;
}

v1::JoinRequest JoinOf(int32_t rank) {
  v1::JoinRequest join;
  join.set_rank(rank);
  join.set_address("127.0.0.1:1");
  join.set_incarnation("test-" + std::to_string(rank));
  join.set_host("h");
  join.set_contract(kContractId);
  return join;
}

TEST_CASE("a Join from a rank outside the world is refused, and planning afterwards still answers") {
  Coordinator coordinator(WorldOf(2));
  for (int32_t rank : {-1, -7, 2, 1 << 30}) {
    INFO(rank);
    const auto joined = coordinator.Join(JoinOf(rank));
    REQUIRE(joined.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(joined.status().message()), Contains("outside a world of 2"));
  }
  REQUIRE(coordinator.Join(JoinOf(0)).ok());
  CHECK(coordinator.Status().agents_size() == 1);
  // The call that wrote outside a vector with a negative rank: refused cleanly instead.
  CHECK_FALSE(coordinator.Explain(v1::ExplainRequest()).ok());
}

TEST_CASE("a Join without an address or incarnation, or with an oversized name, is refused") {
  Coordinator coordinator(WorldOf(2));
  v1::JoinRequest no_address = JoinOf(0);
  no_address.clear_address();
  CHECK_THAT(std::string(coordinator.Join(no_address).status().message()), Contains("address"));
  v1::JoinRequest no_incarnation = JoinOf(0);
  no_incarnation.clear_incarnation();
  CHECK_THAT(std::string(coordinator.Join(no_incarnation).status().message()), Contains("incarnation"));
  v1::JoinRequest huge = JoinOf(0);
  huge.set_node(std::string(4096, 'n'));
  CHECK_THAT(std::string(coordinator.Join(huge).status().message()), Contains("node"));
  CHECK(coordinator.Status().agents_size() == 0);
}

TEST_CASE("an agent of another build is refused by name, and so is a sync while it holds no rank") {
  Coordinator coordinator(WorldOf(3));
  REQUIRE(coordinator.Join(JoinOf(0)).ok());
  v1::JoinRequest other = JoinOf(1);
  other.set_contract("0123456789abcdef");
  const absl::Status refused = coordinator.Join(other).status();
  REQUIRE(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(refused.message()), Contains("rank 1's agent (at 127.0.0.1:1) is of another build") &&
                                                 Contains("0123456789abcdef") && Contains(kContractId));
  v1::JoinRequest older = JoinOf(2);
  older.clear_contract();
  CHECK_THAT(std::string(coordinator.Join(older).status().message()),
             Contains("rank 2's agent") && Contains("none (a build older than contract ids)"));
  CHECK(coordinator.Status().agents_size() == 1);

  // A sync names every rank an agent of another build tried, not merely "not joined".
  const absl::Status sync = coordinator.Sync(v1::SyncRequest()).status();
  REQUIRE(sync.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(sync.message()),
             Contains("refused, no byte moved") && Contains("rank 1's agent") && Contains("rank 2's agent"));
  // This build's agents take the ranks: the refusals are forgotten.
  REQUIRE(coordinator.Join(JoinOf(1)).ok());
  REQUIRE(coordinator.Join(JoinOf(2)).ok());
  const absl::Status later = coordinator.Sync(v1::SyncRequest()).status();
  CHECK_THAT(std::string(later.message()), !Contains("another build"));
  // Another build's agent claiming a rank whose holder is alive changes nothing either.
  CHECK(coordinator.Join(other).status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(coordinator.Sync(v1::SyncRequest()).status().message()), !Contains("another build"));
  CHECK(coordinator.Status().agents_size() == 3);

  // Past three such ranks a refused sync counts the rest.
  Coordinator fresh(WorldOf(5));
  for (int32_t rank = 0; rank < 5; ++rank) {
    v1::JoinRequest join = JoinOf(rank);
    join.set_contract("0123456789abcdef");
    CHECK_FALSE(fresh.Join(join).ok());
  }
  CHECK_THAT(std::string(fresh.Sync(v1::SyncRequest()).status().message()),
             Contains("rank 2's agent") && !Contains("rank 3's agent") && Contains("2 more ranks"));
}

TEST_CASE("a Publish outside the world, before a Join, or with a nameless client is refused") {
  Coordinator coordinator(WorldOf(2));
  v1::PublishRequest publish;
  publish.set_incarnation("test-1");
  publish.set_rank(-3);
  CHECK(coordinator.Publish(publish).status().code() == absl::StatusCode::kInvalidArgument);
  publish.set_rank(1);
  CHECK(coordinator.Publish(publish).status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(coordinator.Join(JoinOf(1)).ok());
  v1::PublishedLayout* layout = publish.add_layouts();
  layout->set_role(v1::SOURCE);
  CHECK_THAT(std::string(coordinator.Publish(publish).status().message()), Contains("client id"));
  layout->set_client_id("trainer-1");
  layout->add_buffers()->set_bytes(-1);
  CHECK_THAT(std::string(coordinator.Publish(publish).status().message()), Contains("buffer name"));
  layout->mutable_buffers(0)->set_name("flat");
  CHECK_THAT(std::string(coordinator.Publish(publish).status().message()), Contains("-1 bytes"));
  layout->mutable_buffers(0)->set_bytes(64);
  CHECK(coordinator.Publish(publish).ok());
}

TEST_CASE("a rank belongs to its live incarnation: a second claimant's Join and Publish are refused") {
  Coordinator coordinator(WorldOf(3));
  REQUIRE(coordinator.Join(JoinOf(2)).ok());
  v1::PublishRequest real;
  real.set_rank(2);
  real.set_incarnation("test-2");
  v1::PublishedLayout* layout = real.add_layouts();
  layout->set_client_id("trainer-2");
  layout->set_role(v1::SOURCE);
  REQUIRE(coordinator.Publish(real).ok());
  CHECK(coordinator.Join(JoinOf(2))->published());  // the agent's heartbeat: nothing to publish again

  v1::JoinRequest rogue = JoinOf(2);
  rogue.set_incarnation("rogue");
  rogue.set_address("127.0.0.1:2");
  const auto taken = coordinator.Join(rogue);
  REQUIRE(taken.status().code() == absl::StatusCode::kAlreadyExists);
  CHECK_THAT(std::string(taken.status().message()), Contains("belongs to a live agent"));
  // The live incarnation is a credential: no answer hands it out.
  CHECK_THAT(std::string(taken.status().message()), !Contains("test-2"));
  v1::PublishRequest empty;  // an empty publication would have erased the real one
  empty.set_rank(2);
  empty.set_incarnation("rogue");
  const absl::Status refused = coordinator.Publish(empty).status();
  CHECK(refused.code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(std::string(refused.message()), !Contains("test-2"));
  const v1::CoordinatorStatus status = coordinator.Status();
  REQUIRE(status.agents_size() == 1);
  CHECK(status.agents(0).address() == "127.0.0.1:1");  // still the real agent
  CHECK(coordinator.Join(JoinOf(2))->published());     // and its layouts
}

TEST_CASE("under mutual TLS a rank is tied to its first Join's certificate: another is refused, dead holder or not") {
  Coordinator coordinator(WorldOf(3));
  REQUIRE(coordinator.Join(JoinOf(1), "node-a.test").ok());
  v1::JoinRequest restarted = JoinOf(1);  // a new process: the same certificate, later
  restarted.set_incarnation("test-1-again");
  const absl::Status other = coordinator.Join(restarted, "node-b.test").status();
  CHECK(other.code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(std::string(other.message()),
             Contains("rank 1 is tied to 'node-a.test'") && Contains("this call presents 'node-b.test'"));
  CHECK_THAT(std::string(coordinator.Join(restarted).status().message()), Contains("presents no certificate"));
  // The certificate is checked before the build: another host's agent of another build
  // is refused as not the rank's, not as a build the rank's own agent might be.
  v1::JoinRequest other_build = restarted;
  other_build.set_contract("0123456789abcdef");
  CHECK(coordinator.Join(other_build, "node-b.test").status().code() == absl::StatusCode::kPermissionDenied);
  v1::PublishRequest publish;
  publish.set_rank(1);
  publish.set_incarnation("test-1");
  CHECK(coordinator.Publish(publish, "node-b.test").status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(coordinator.Publish(publish, "node-a.test").ok());
  // The same certificate is only held off while the holder lives (ALREADY_EXISTS, not
  // PERMISSION_DENIED): once silent, its restart takes the rank.
  CHECK(coordinator.Join(restarted, "node-a.test").status().code() == absl::StatusCode::kAlreadyExists);
  // A rank first joined without a certificate stays so.
  REQUIRE(coordinator.Join(JoinOf(2)).ok());
  CHECK(coordinator.Join(JoinOf(2), "node-a.test").status().code() == absl::StatusCode::kPermissionDenied);
}

TEST_CASE("a sync's deadline is the coordinator's unless the request asks for a smaller one") {
  CHECK(SyncTimeout(0, absl::Seconds(8)) == absl::Seconds(8));
  CHECK(SyncTimeout(60000, absl::Seconds(8)) == absl::Seconds(8));
  CHECK(SyncTimeout(2000, absl::Seconds(8)) == absl::Seconds(2));
  Coordinator coordinator(WorldOf(1));
  CHECK(coordinator.Status().sync_timeout_ms() == 60000);  // what shardsyncctl waits for by default
}

}  // namespace
}  // namespace shardsync::coordinator
