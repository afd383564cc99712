// The agent's registry refuses memory that belongs to another user than the process
// registering it (where the memory has an owner, as host shared memory does), and a
// target over any other registered memory or over the agent's own.
#include "daemon/agent/registry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <vector>

#include "executor/host_shm.h"
#include "executor/signal_board.h"
#include "planner/quantize.h"
#include "tests/common/unique_name.h"

namespace shardsync::agent {
namespace {

using Catch::Matchers::Contains;

// Memory owned by `owner` (none: like CUDA IPC, whose handles carry no owner).
class FakeBuffer final : public executor::MappedBuffer {
 public:
  FakeBuffer(int64_t bytes, std::optional<uint32_t> owner) : bytes_(bytes, 1), owner_(owner) {}
  uint8_t* data() const override { return const_cast<uint8_t*>(bytes_.data()); }
  int64_t bytes() const override { return static_cast<int64_t>(bytes_.size()); }
  bool on_device() const override { return false; }
  std::optional<uint32_t> owner_uid() const override { return owner_; }

 private:
  std::vector<uint8_t> bytes_;
  std::optional<uint32_t> owner_;
};

// Takes handles named "uid:N" (owned by N) or "any" (no owner); "full" cannot be backed.
class FakeBackend final : public executor::MemoryBackend {
 public:
  absl::string_view name() const override { return "fake"; }
  bool Accepts(const executor::MemoryHandle& handle) const override { return !handle.shm_name.empty(); }
  absl::StatusOr<std::unique_ptr<executor::MappedBuffer>> Open(const executor::MemoryHandle& handle,
                                                               int64_t bytes) override {
    if (handle.shm_name == "full") return absl::ResourceExhaustedError("cannot back 64 bytes: No space left on device");
    std::optional<uint32_t> owner;
    if (handle.shm_name.rfind("uid:", 0) == 0) owner = static_cast<uint32_t>(std::stoul(handle.shm_name.substr(4)));
    return std::unique_ptr<executor::MappedBuffer>(new FakeBuffer(bytes, owner));
  }
};

v1::RegisterRequest Request(const std::string& client, const std::string& handle) {
  v1::RegisterRequest request;
  request.set_client_id(client);
  request.set_role(v1::TARGET);
  v1::RegisteredBuffer* b = request.add_buffers();
  b->set_name("arena-" + client);
  b->set_bytes(64);
  b->mutable_handle()->set_shm_name(handle);
  return request;
}

TEST_CASE("memory of a kind the agent does not take is refused, naming both kinds and where it goes") {
  executor::HostShmBackend host;
  Registry registry(0, {&host});
  v1::RegisterRequest request = Request("rollout", "");
  request.mutable_buffers(0)->mutable_handle()->set_cuda_ipc_handle(std::string(64, '\x07'));
  request.mutable_buffers(0)->mutable_handle()->set_device(0);
  const absl::Status refused = registry.Add(request, Peer{1234, 1000});
  CHECK(absl::IsInvalidArgument(refused));
  CHECK_THAT(std::string(refused.message()),
             Contains("client 'rollout' buffer 'arena-rollout': memory of CUDA device 0 is not taken by this agent "
                      "(it takes host-shm): host memory goes to an agent of --device cpu"));
  CHECK(registry.Clients().empty());
}

TEST_CASE("a client registers only memory its own uid owns") {
  FakeBackend backend;
  Registry registry(0, {&backend});
  const Peer peer{1234, 1000};
  const absl::Status other = registry.Add(Request("intruder", "uid:0"), peer);
  CHECK(absl::IsPermissionDenied(other));
  CHECK_THAT(std::string(other.message()),
             Contains("client 'intruder'") && Contains("belongs to uid 0") && Contains("pid 1234, uid 1000"));
  CHECK(registry.Clients().empty());

  REQUIRE(registry.Add(Request("owner", "uid:1000"), peer).ok());
  REQUIRE(registry.Add(Request("device", "any"), peer).ok());  // no owner to compare
  const std::vector<v1::ClientInfo> clients = registry.Clients();
  REQUIRE(clients.size() == 2);
  for (const v1::ClientInfo& c : clients) {
    CHECK(c.pid() == 1234);
    CHECK(c.uid() == 1000);
  }
}

// One buffer [offset, offset + bytes) of shared memory object `shm`, of `role`.
v1::RegisterRequest OneBuffer(const std::string& client, v1::Role role, const std::string& buffer,
                              const std::string& shm, int64_t offset, int64_t bytes) {
  v1::RegisterRequest request;
  request.set_client_id(client);
  request.set_role(role);
  v1::RegisteredBuffer* b = request.add_buffers();
  b->set_name(buffer);
  b->set_bytes(bytes);
  b->mutable_handle()->set_shm_name(shm);
  b->mutable_handle()->set_offset_bytes(offset);
  return request;
}

TEST_CASE("a target over other registered memory, or over the agent's own, is refused naming both") {
  const std::string object = testing::UniqueName("/shardsync-registry-test-");
  const std::string alias = object + "-alias";
  const int fd = shm_open(object.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 64 << 10) == 0);
  close(fd);
  REQUIRE(link(("/dev/shm" + object).c_str(), ("/dev/shm" + alias).c_str()) == 0);  // one object, two names
  executor::HostShmBackend backend;
  Registry registry(0, {&backend});
  const Peer peer{1, geteuid()};
  REQUIRE(registry.Add(OneBuffer("trainer", v1::SOURCE, "flat", object, 0, 32 << 10), peer).ok());
  // Sources may share memory: nobody writes them.
  CHECK(registry.Add(OneBuffer("masters", v1::SOURCE, "copy", alias, 4096, 4096), peer).ok());

  absl::Status over = registry.Add(OneBuffer("rollout", v1::TARGET, "arena", object, 16 << 10, 32 << 10), peer);
  CHECK(absl::IsInvalidArgument(over));
  CHECK_THAT(std::string(over.message()), Contains("client 'rollout' buffer 'arena'") &&
                                              Contains("overlaps buffer 'flat' of client 'trainer', a SOURCE"));
  over = registry.Add(OneBuffer("rollout", v1::TARGET, "arena", alias, 30 << 10, 4096), peer);  // by its other name
  CHECK_THAT(std::string(over.message()), Contains("overlaps buffer 'flat'"));
  REQUIRE(registry.Add(OneBuffer("rollout", v1::TARGET, "arena", alias, 32 << 10, 16 << 10), peer).ok());  // beside
  over = registry.Add(OneBuffer("second", v1::TARGET, "other", object, 40 << 10, 4096), peer);
  CHECK_THAT(std::string(over.message()), Contains("overlaps buffer 'arena' of client 'rollout', a TARGET"));

  // Two buffers of one registration.
  v1::RegisterRequest twice = OneBuffer("twice", v1::TARGET, "a", object, 48 << 10, 8192);
  *twice.add_buffers() = OneBuffer("twice", v1::TARGET, "b", alias, 52 << 10, 8192).buffers(0);
  CHECK_THAT(std::string(registry.Add(twice, peer).message()), Contains("overlaps buffer"));

  // The agent's signal board.
  auto board = executor::SignalBoard::Create(object + "-board");
  REQUIRE(board.ok());
  const absl::StatusOr<executor::MemorySpan> board_span = (*board)->span();
  REQUIRE(board_span.ok());
  registry.Reserve(*board_span, "this agent's signal board");
  over = registry.Add(OneBuffer("board", v1::SOURCE, "board", (*board)->name(), 0, 4096), peer);
  CHECK(absl::IsInvalidArgument(over));
  CHECK_THAT(std::string(over.message()), Contains("its memory is this agent's signal board"));
  shm_unlink(object.c_str());
  shm_unlink(alias.c_str());
}

TEST_CASE("memory the backend cannot back is refused with its code kept, naming client and buffer") {
  FakeBackend backend;
  Registry registry(0, {&backend});
  const absl::Status full = registry.Add(Request("rollout", "full"), Peer{1, 1000});
  CHECK(absl::IsResourceExhausted(full));  // a full /dev/shm, not a bad request
  CHECK_THAT(std::string(full.message()),
             Contains("client 'rollout' buffer 'arena-rollout'") && Contains("No space left on device"));
}

TEST_CASE("a tensor naming a buffer its registration lacks is refused by that buffer's name") {
  FakeBackend backend;
  Registry registry(0, {&backend});
  v1::RegisterRequest request = Request("engine", "any");
  v1::TensorLayout* t = request.add_tensors();
  t->set_name("w");
  t->add_shape(2);
  t->add_shape(8);
  t->set_dtype(v1::FLOAT8_E4M3);
  v1::Placement* p = t->add_placements();
  p->set_buffer("arena-engine");
  for (int64_t v : {0, 0}) p->mutable_box()->add_lo(v);
  for (int64_t v : {2, 8}) p->mutable_box()->add_hi(v);
  for (int64_t v : {8, 1}) p->add_strides(v);
  t->add_block_scales()->set_buffer("scales-engine");
  const absl::Status refused = registry.Add(request, Peer{1, 1000});
  CHECK(absl::IsInvalidArgument(refused));
  CHECK_THAT(std::string(refused.message()),
             Contains("tensor 'w' names buffer 'scales-engine'") && Contains("does not register"));
  CHECK(registry.Clients().empty());
}

TEST_CASE("registrations past the agent's limits, in all or per uid, are refused naming the limit") {
  FakeBackend backend;
  Registry registry(0, {&backend}, RegistryLimits{3, 2});
  const Peer alice{1, 1000}, bob{2, 1001};
  REQUIRE(registry.Add(Request("a1", "any"), alice).ok());
  REQUIRE(registry.Add(Request("a2", "any"), alice).ok());
  const absl::Status per_uid = registry.Add(Request("a3", "any"), alice);
  CHECK(absl::IsResourceExhausted(per_uid));
  CHECK_THAT(std::string(per_uid.message()), Contains("uid 1000 holds 2") && Contains("--max-registrations-per-uid"));
  REQUIRE(registry.Add(Request("b1", "any"), bob).ok());
  const absl::Status total = registry.Add(Request("b2", "any"), bob);
  CHECK(absl::IsResourceExhausted(total));
  CHECK_THAT(std::string(total.message()), Contains("holds 3 registrations") && Contains("--max-registrations"));
  registry.Remove("a1");  // a dropped registration frees its place
  CHECK(registry.Add(Request("b2", "any"), bob).ok());
}

TEST_CASE("registrations past the agent's --max-tensors are refused naming it") {
  FakeBackend backend;
  RegistryLimits limits;
  limits.tensors = 3;
  Registry registry(0, {&backend}, limits);
  const Peer peer{1, 1000};
  const auto with_tensors = [](const std::string& client, int tensors) {
    v1::RegisterRequest request = Request(client, "any");
    for (int k = 0; k < tensors; ++k) {
      v1::TensorLayout* t = request.add_tensors();
      t->set_name(client + "." + std::to_string(k));
      t->add_shape(4);
      t->set_dtype(v1::FLOAT32);
      v1::Placement* p = t->add_placements();
      p->set_buffer("arena-" + client);
      p->set_base(4 * k);
      p->mutable_box()->add_lo(0);
      p->mutable_box()->add_hi(4);
    }
    return request;
  };
  REQUIRE(registry.Add(with_tensors("first", 2), peer).ok());
  const absl::Status past = registry.Add(with_tensors("second", 2), peer);
  CHECK(absl::IsResourceExhausted(past));
  CHECK_THAT(
      std::string(past.message()),
      Contains("client 'second': its 2 tensors beside the 2 held are past this agent's limit 3 (--max-tensors)"));
  CHECK(registry.Add(with_tensors("third", 1), peer).ok());
}

TEST_CASE("a dropped 100k-tensor registration gives the agent's memory back", "[rss]") {
  FakeBackend backend;
  Registry registry(0, {&backend});
  const auto resident = [] {
    std::ifstream statm("/proc/self/statm");
    int64_t size = 0, pages = 0;
    statm >> size >> pages;
    return pages * sysconf(_SC_PAGESIZE);
  };
  const int64_t before = resident();
  {
    v1::RegisterRequest request = Request("engine", "any");
    request.mutable_buffers(0)->set_bytes(int64_t{100000} * 256);
    for (int k = 0; k < 100000; ++k) {
      v1::TensorLayout* t = request.add_tensors();
      t->set_name("model.layers." + std::to_string(k) + ".weight");
      t->add_shape(64);
      t->set_dtype(v1::FLOAT32);
      v1::Placement* p = t->add_placements();
      p->set_buffer("arena-engine");
      p->set_base(int64_t{64} * k);
      p->mutable_box()->add_lo(0);
      p->mutable_box()->add_hi(64);
    }
    REQUIRE(registry.Add(std::move(request), Peer{1, 1000}).ok());
  }
  const int64_t held = resident();
  registry.Remove("engine");
  const int64_t after = resident();
  INFO("resident MiB: " << before / 1048576.0 << " before, " << held / 1048576.0 << " registered, " << after / 1048576.0
                        << " after");
  REQUIRE(held - before > 16 << 20);  // the registration is large
  CHECK(after - before < (held - before) / 4);
}

TEST_CASE("a peer gets a target's registration by name, never a source's; a new registration is newer") {
  FakeBackend backend;
  Registry registry(0, {&backend});
  const Peer peer{1, 1000};
  REQUIRE(registry.Add(Request("rollout", "uid:1000"), peer).ok());
  v1::RegisterRequest source = Request("trainer", "uid:1000");
  source.set_role(v1::SOURCE);
  REQUIRE(registry.Add(source, peer).ok());
  int64_t registered_at = 0;
  auto target = registry.TargetHandle("arena-rollout", &registered_at);
  REQUIRE(target.ok());
  CHECK(target->handle().shm_name() == "uid:1000");
  CHECK(target->bytes() == 64);
  CHECK(registered_at == registry.Find("arena-rollout")->registered_at);
  const int64_t first = registered_at;
  auto refused = registry.TargetHandle("arena-trainer", &registered_at);
  CHECK(absl::IsPermissionDenied(refused.status()));
  CHECK_THAT(std::string(refused.status().message()), Contains("'arena-trainer' on rank 0 is a SOURCE"));
  refused = registry.TargetHandle("nowhere", &registered_at);
  CHECK(absl::IsNotFound(refused.status()));
  CHECK_THAT(std::string(refused.status().message()), Contains("'nowhere' is not registered on rank 0"));
  // The same name and handle registered again: new memory, a newer registration.
  registry.Remove("rollout");
  REQUIRE(registry.Add(Request("rollout", "uid:1000"), peer).ok());
  REQUIRE(registry.TargetHandle("arena-rollout", &registered_at).ok());
  CHECK(registered_at > first);
}

// Takes passed descriptors and maps them without keeping one (no backend does so today).
class KeepsNoDescriptorBackend final : public executor::MemoryBackend {
 public:
  absl::string_view name() const override { return "keeps-no-descriptor"; }
  bool Accepts(const executor::MemoryHandle& handle) const override { return handle.fd >= 0; }
  absl::StatusOr<std::unique_ptr<executor::MappedBuffer>> Open(const executor::MemoryHandle&, int64_t bytes) override {
    return std::unique_ptr<executor::MappedBuffer>(new FakeBuffer(bytes, std::nullopt));
  }
};

TEST_CASE("a passed target whose mapping keeps no descriptor is named, not handed on as -1") {
  KeepsNoDescriptorBackend backend;
  Registry registry(2, {&backend});
  v1::RegisterRequest request = Request("rollout", "");
  v1::MemoryHandle* handle = request.mutable_buffers(0)->mutable_handle();
  handle->set_descriptor_token("token-1");
  handle->set_device(-1);  // host memory
  ClaimedDescriptors descriptors;
  descriptors["token-1"].emplace_back(memfd_create("registry_test", MFD_CLOEXEC));
  REQUIRE(descriptors["token-1"].back().valid());
  const absl::Status added = registry.Add(request, Peer{1, 1000}, nullptr, std::move(descriptors));
  INFO(added.message());
  REQUIRE(added.ok());
  const absl::StatusOr<std::vector<UniqueFd>> handed = registry.TargetDescriptors("token-1");
  CHECK(absl::IsInternal(handed.status()));
  CHECK_THAT(std::string(handed.status().message()),
             Contains("buffer 'arena-rollout' on rank 2 was passed as descriptors, but its mapping keeps none"));
  CHECK(absl::IsNotFound(registry.TargetDescriptors("token-2").status()));
}

}  // namespace
}  // namespace shardsync::agent

namespace shardsync::agent {
namespace {

TEST_CASE("a scratch above the agent's limit is refused naming it, and nothing is allocated") {
  executor::HostShmBackend backend;
  RegistryLimits limits;
  limits.scratch_bytes = 8192;
  Registry registry(3, {&backend}, limits);
  REQUIRE(registry.ProvideScratch(8192).ok());
  // Any caller of TargetMemory could ask for this: 3 GiB were allocated in 0.33 s before.
  const absl::Status refused = registry.ProvideScratch(int64_t{3} << 30);
  CHECK(absl::IsResourceExhausted(refused));
  CHECK_THAT(std::string(refused.message()), Contains("--max-scratch-bytes (8192)"));
  const std::shared_ptr<const BufferEntry> kept = registry.Find(planner::kScratchBufferName);
  REQUIRE(kept);
  CHECK(kept->memory->bytes() == 8192);  // the scratch it had stays
}

TEST_CASE("the agent's scratch: found and handed to peers as a target, replaced by size, never published") {
  executor::HostShmBackend backend;
  Registry registry(3, {&backend});
  const int64_t version = registry.version();
  REQUIRE(registry.ProvideScratch(4096).ok());
  CHECK(registry.version() == version);
  CHECK(registry.Layouts(nullptr).empty());
  const std::shared_ptr<const BufferEntry> entry = registry.Find(planner::kScratchBufferName);
  REQUIRE(entry);
  CHECK(entry->role == v1::TARGET);
  CHECK(entry->memory->bytes() == 4096);
  int64_t registered_at = 0;
  auto handed = registry.TargetHandle(planner::kScratchBufferName, &registered_at);
  REQUIRE(handed.ok());
  CHECK(handed->bytes() == 4096);
  CHECK(registered_at < 0);
  // A peer maps the same memory.
  auto peer = registry.OpenPeer(*handed, {});
  REQUIRE(peer.ok());
  entry->memory->data()[4095] = 42;
  CHECK((*peer)->data()[4095] == 42);
  // The same size keeps it; another size is new memory; 0 drops it.
  REQUIRE(registry.ProvideScratch(4096).ok());
  CHECK(registry.Find(planner::kScratchBufferName) == entry);
  REQUIRE(registry.ProvideScratch(8192).ok());
  int64_t again = 0;
  REQUIRE(registry.TargetHandle(planner::kScratchBufferName, &again).ok());
  CHECK(again != registered_at);
  REQUIRE(registry.ProvideScratch(0).ok());
  CHECK_FALSE(registry.Find(planner::kScratchBufferName));
  // Clients cannot take the agent's names.
  v1::RegisterRequest request = Request("client", "any");
  request.mutable_buffers(0)->set_name("shardsync.scratch");
  const absl::Status refused = registry.Add(request, Peer{1, 1});
  CHECK(absl::IsInvalidArgument(refused));
  CHECK_THAT(std::string(refused.message()), Contains("names starting 'shardsync.' are the agent's"));
}

}  // namespace
}  // namespace shardsync::agent
