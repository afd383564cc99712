// Bad registrations, against a real agent: each is refused with a clear reason before
// anything is held, and the agent's registry stays as it was.
#include <sys/mman.h>

#include <catch2/catch.hpp>

#include "client/cpp/client.h"
#include "tests/common/unique_name.h"
#include "tools/localsync/cluster.h"

namespace shardsync::localsync {
namespace {

using Catch::Matchers::Contains;

// A bf16 tensor of `elements` placed whole at `base` of buffer "b".
v1::TensorLayout Tensor(const std::string& name, int64_t elements, int64_t base) {
  v1::TensorLayout t;
  t.set_name(name);
  t.add_shape(elements);
  t.set_dtype(v1::BFLOAT16);
  v1::Placement* p = t.add_placements();
  p->mutable_box()->add_lo(0);
  p->mutable_box()->add_hi(elements);
  p->set_buffer("b");
  p->set_base(base);
  return t;
}

v1::RegisterRequest Request(const std::string& client, v1::Role role, const client::SharedMemory& shm,
                            int64_t claimed_bytes) {
  v1::RegisterRequest request;
  request.set_client_id(client);
  request.set_role(role);
  v1::RegisteredBuffer* b = request.add_buffers();
  b->set_name("b");
  b->set_bytes(claimed_bytes);
  b->mutable_handle()->set_shm_name(shm.name());
  b->mutable_handle()->set_device(-1);
  return request;
}

TEST_CASE("bad registrations are refused with their reason and leave nothing registered") {
  ClusterOptions options;
  options.agents = 1;
  Cluster cluster(options);
  client::AgentClient agent(cluster.socket(0));
  const std::string name = testing::UniqueName("/ss-registration-");
  auto shm = client::SharedMemory::Create(name, 64);
  REQUIRE(shm.ok());
  const auto refused = [&](const v1::RegisterRequest& request) {
    auto registration = agent.Register(request, absl::Seconds(10));
    REQUIRE_FALSE(registration.ok());
    return std::string(registration.status().message());
  };

  SECTION("a buffer smaller than claimed") {
    v1::RegisterRequest request = Request("trainer", v1::SOURCE, **shm, 128);
    CHECK_THAT(refused(request), Contains("buffer 'b'") && Contains("holds 64 bytes") && Contains("claims 128"));
  }
  SECTION("a placement outside its buffer") {
    v1::RegisterRequest request = Request("trainer", v1::SOURCE, **shm, 64);
    *request.add_tensors() = Tensor("w", 32, 8);  // 40 elements of 2 bytes in 64
    CHECK_THAT(refused(request), Contains("tensor 'w'") && Contains("needs 80 bytes"));
  }
  SECTION("overlapping targets") {
    v1::RegisterRequest request = Request("rollout", v1::TARGET, **shm, 64);
    *request.add_tensors() = Tensor("a", 16, 0);
    *request.add_tensors() = Tensor("b", 16, 8);
    CHECK_THAT(refused(request), Contains("overlap"));
  }
  SECTION("no role") {
    v1::RegisterRequest request = Request("trainer", v1::ROLE_UNSPECIFIED, **shm, 64);
    CHECK_THAT(refused(request), Contains("role must be SOURCE or TARGET"));
  }
  SECTION("a handle no backend takes") {
    v1::RegisterRequest request = Request("trainer", v1::SOURCE, **shm, 64);
    request.mutable_buffers(0)->mutable_handle()->clear_shm_name();
    CHECK_THAT(refused(request), Contains("client 'trainer' buffer 'b': its handle names no memory"));
  }
  SECTION("a ready event on a CPU agent, or from a target") {
    v1::RegisterRequest source = Request("trainer", v1::SOURCE, **shm, 64);
    source.set_ready_event(std::string(64, 'e'));
    CHECK_THAT(refused(source), Contains("client 'trainer': ready event") && Contains("needs a CUDA agent"));
    v1::RegisterRequest target = Request("rollout", v1::TARGET, **shm, 64);
    target.set_ready_event(std::string(64, 'e'));
    CHECK_THAT(refused(target), Contains("only a SOURCE gives a ready event"));
  }
  SECTION("a client id or a buffer name registered twice") {
    auto held = agent.Register(Request("trainer", v1::SOURCE, **shm, 64), absl::Seconds(10));
    REQUIRE(held.ok());
    CHECK_THAT(refused(Request("trainer", v1::SOURCE, **shm, 64)), Contains("'trainer' is already registered"));
    CHECK_THAT(refused(Request("other", v1::TARGET, **shm, 64)), Contains("buffer 'b' is already registered"));
    auto status = agent.Status(absl::Seconds(5));
    REQUIRE(status.ok());
    CHECK(status->clients_size() == 1);  // only the first
    return;
  }
  auto status = agent.Status(absl::Seconds(5));
  REQUIRE(status.ok());
  CHECK(status->clients_size() == 0);
}

TEST_CASE("host memory passed as a descriptor registers through the C++ client") {
  ClusterOptions options;
  options.agents = 1;
  Cluster cluster(options);
  client::AgentClient agent(cluster.socket(0));
  const int memory = memfd_create("ss-registration", MFD_CLOEXEC);
  REQUIRE(memory >= 0);
  REQUIRE(ftruncate(memory, 64) == 0);
  v1::RegisterRequest request;
  request.set_client_id("trainer");
  request.set_role(v1::SOURCE);
  v1::RegisteredBuffer* b = request.add_buffers();
  b->set_name("b");
  b->set_bytes(64);
  b->mutable_handle()->set_device(-1);
  *request.add_tensors() = Tensor("t", 32, 0);

  SECTION("a descriptor for a buffer the request does not have") {
    auto refused = agent.Register(request, absl::Seconds(10), {{"b", memory}, {"c", memory}});
    CHECK(absl::IsInvalidArgument(refused.status()));
    CHECK_THAT(std::string(refused.status().message()), Contains("1 descriptors are given for buffers"));
  }
  SECTION("memory smaller than claimed") {
    request.mutable_buffers(0)->set_bytes(128);
    auto refused = agent.Register(request, absl::Seconds(10), {{"b", memory}});
    CHECK_THAT(std::string(refused.status().message()),
               Contains("buffer 'b'") && Contains("holds 64 bytes; the registration claims 128"));
  }
  SECTION("held while the registration lives") {
    auto held = agent.Register(request, absl::Seconds(10), {{"b", memory}});
    REQUIRE(held.ok());
    auto status = agent.Status(absl::Seconds(5));
    REQUIRE(status.ok());
    REQUIRE(status->clients_size() == 1);
    CHECK(status->clients(0).bytes() == 64);
    close(memory);
    return;
  }
  close(memory);
  auto status = agent.Status(absl::Seconds(5));
  REQUIRE(status.ok());
  CHECK(status->clients_size() == 0);
}

}  // namespace
}  // namespace shardsync::localsync
