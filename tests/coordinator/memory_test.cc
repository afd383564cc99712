// What a registration costs the coordinator is given back when it goes: a 100k-tensor
// publication, planned, then replaced by an empty one, leaves the coordinator's
// resident memory near where it started; and a publication past --max-tensors is
// refused.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <string>

#include "common/contract_id.h"
#include "common/tls.h"
#include "daemon/coordinator/coordinator.h"

namespace shardsync::coordinator {
namespace {

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

v1::PublishedLayout Layout(v1::Role role, int32_t tensors) {
  v1::PublishedLayout layout;
  layout.set_client_id(role == v1::SOURCE ? "trainer" : "rollout");
  layout.set_role(role);
  v1::BufferInfo* buffer = layout.add_buffers();
  buffer->set_name(role == v1::SOURCE ? "flat" : "arena");
  buffer->set_bytes(int64_t{tensors} * 64 * 4);
  for (int32_t t = 0; t < tensors; ++t) {
    v1::TensorLayout* tensor = layout.add_tensors();
    tensor->set_name("model.layers." + std::to_string(t) + ".weight");
    tensor->add_shape(64);
    tensor->set_dtype(v1::FLOAT32);
    v1::Placement* whole = tensor->add_placements();
    whole->set_buffer(buffer->name());
    whole->set_base(int64_t{t} * 64);
    whole->mutable_box()->add_lo(0);
    whole->mutable_box()->add_hi(64);
  }
  return layout;
}

TEST_CASE("a dropped 100k-tensor registration gives its memory back", "[rss]") {
  CoordinatorConfig config;
  TlsConfig plaintext;
  plaintext.insecure = true;
  config.credentials = *LoadCredentials(plaintext);
  Coordinator coordinator(config);
  v1::JoinRequest join;
  join.set_address("127.0.0.1:1");
  join.set_incarnation("memory-test");
  join.set_contract(kContractId);
  REQUIRE(coordinator.Join(join).ok());
  v1::PublishRequest empty;
  empty.set_incarnation("memory-test");
  REQUIRE(coordinator.Publish(empty).ok());
  const int64_t before = ResidentBytes();

  constexpr int32_t kTensors = 100000;
  {
    v1::PublishRequest large = empty;
    *large.add_layouts() = Layout(v1::SOURCE, kTensors);
    *large.add_layouts() = Layout(v1::TARGET, kTensors);
    REQUIRE(coordinator.Publish(large).ok());
  }
  const auto explained = coordinator.Explain(v1::ExplainRequest());
  REQUIRE(explained.ok());
  const int64_t held = ResidentBytes();

  REQUIRE(coordinator.Publish(empty).ok());  // the clients went away
  const int64_t after = ResidentBytes();
  INFO("resident MiB: " << before / 1048576.0 << " before, " << held / 1048576.0 << " with the registration, "
                        << after / 1048576.0 << " after it went");
  REQUIRE(held - before > 64 << 20);  // the registration and its plan are large
  CHECK(after - before < (held - before) / 5);
}

TEST_CASE("a publication past the coordinator's --max-tensors is refused naming it; the one held stays") {
  CoordinatorConfig config;
  TlsConfig plaintext;
  plaintext.insecure = true;
  config.credentials = *LoadCredentials(plaintext);
  config.max_tensors = 1000;
  Coordinator coordinator(config);
  v1::JoinRequest join;
  join.set_address("127.0.0.1:1");
  join.set_incarnation("limit-test");
  join.set_contract(kContractId);
  REQUIRE(coordinator.Join(join).ok());
  v1::PublishRequest fits;
  fits.set_incarnation("limit-test");
  *fits.add_layouts() = Layout(v1::SOURCE, 600);
  const absl::StatusOr<v1::PublishResponse> held = coordinator.Publish(fits);
  REQUIRE(held.ok());
  v1::PublishRequest past = fits;
  *past.add_layouts() = Layout(v1::TARGET, 401);
  const absl::StatusOr<v1::PublishResponse> refused = coordinator.Publish(past);
  CHECK(absl::IsResourceExhausted(refused.status()));
  CHECK_THAT(
      std::string(refused.status().message()),
      Catch::Matchers::Contains("rank 0 published 1001 tensors, past the coordinator's limit 1000 (--max-tensors)"));
  const v1::CoordinatorStatus status = coordinator.Status();
  CHECK(status.layout_epoch() == held->layout_epoch());
  REQUIRE(status.agents_size() == 1);
  CHECK(status.agents(0).clients() == 1);
}

}  // namespace
}  // namespace shardsync::coordinator
