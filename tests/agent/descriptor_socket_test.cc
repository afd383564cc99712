// The descriptor socket: a client's memfd passed there is claimed by its registration
// alone and mapped by the registry (the bytes seen both ways), a same-node peer fetches a
// target's descriptors, and nothing passed outlives what holds it: a closed connection,
// a refused put, a dropped registration each leave this process's descriptors as they
// were.
#include "daemon/agent/descriptor_socket.h"

#include <dirent.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/agent/registry.h"
#include "executor/host_shm.h"
#include "tests/common/unique_name.h"

namespace shardsync::agent {
namespace {

using Catch::Matchers::Contains;

int OpenDescriptors() {
  int count = 0;
  DIR* dir = opendir("/proc/self/fd");
  while (const dirent* entry = readdir(dir)) count += entry->d_name[0] != '.';
  closedir(dir);
  return count;
}

// Waits (bounded: only a hang exceeds it) until `done`.
template <typename Done>
bool Eventually(Done done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

UniqueFd Memfd(int64_t bytes) {
  UniqueFd fd(memfd_create("descriptor-test", MFD_CLOEXEC));
  REQUIRE(fd.valid());
  REQUIRE(ftruncate(fd.get(), bytes) == 0);
  return fd;
}

std::string SocketPath() { return testing::UniqueName("/tmp/shardsync-fds-test-") + ".fds"; }

std::unique_ptr<DescriptorSocket> Listen(const Registry* registry, DescriptorSocket::Limits limits = {}) {
  auto socket = DescriptorSocket::Listen(
      SocketPath(), "",
      [registry](const std::string& token) -> absl::StatusOr<std::vector<UniqueFd>> {
        if (registry == nullptr) return absl::NotFoundError("no registry");
        return registry->TargetDescriptors(token);
      },
      limits);
  REQUIRE(socket.ok());
  return *std::move(socket);
}

v1::RegisterRequest Request(const std::string& client, v1::Role role, const std::string& token, int64_t bytes,
                            int64_t offset) {
  v1::RegisterRequest request;
  request.set_client_id(client);
  request.set_role(role);
  v1::RegisteredBuffer* b = request.add_buffers();
  b->set_name("arena-" + client);
  b->set_bytes(bytes);
  b->mutable_handle()->set_descriptor_token(token);
  b->mutable_handle()->set_offset_bytes(offset);
  b->mutable_handle()->set_device(-1);
  return request;
}

TEST_CASE("descriptors put are claimed once, by the process that put them", "[descriptors]") {
  const int before = OpenDescriptors();
  {
    auto socket = Listen(nullptr);
    absl::StatusOr<UniqueFd> connection = ConnectDescriptorSocket(SocketPath());
    REQUIRE(connection.ok());
    UniqueFd memory = Memfd(4096);
    absl::StatusOr<std::string> token =
        PutDescriptors(connection->get(), {memory.get()}, absl::Now() + absl::Seconds(30));
    REQUIRE(token.ok());
    CHECK(token->size() == 32);
    CHECK(socket->waiting() == 1);

    absl::StatusOr<std::vector<UniqueFd>> stranger = socket->Claim(*token, getpid() + 1);
    CHECK(absl::IsPermissionDenied(stranger.status()));
    CHECK_THAT(std::string(stranger.status().message()), Contains(absl::StrCat("put by pid ", getpid())));

    absl::StatusOr<std::vector<UniqueFd>> claimed = socket->Claim(*token, getpid());
    REQUIRE(claimed.ok());
    REQUIRE(claimed->size() == 1);
    // The same memory: written through one descriptor, read through the other.
    REQUIRE(pwrite(memory.get(), "abc", 3, 100) == 3);
    char seen[3];
    REQUIRE(pread((*claimed)[0].get(), seen, 3, 100) == 3);
    CHECK(std::memcmp(seen, "abc", 3) == 0);
    CHECK(socket->waiting() == 0);
    CHECK(absl::IsNotFound(socket->Claim(*token, getpid()).status()));
  }
  CHECK(OpenDescriptors() == before);
}

TEST_CASE("descriptors nobody claimed close with the connection that put them", "[descriptors]") {
  const int before = OpenDescriptors();
  {
    auto socket = Listen(nullptr);
    std::string token;
    {
      absl::StatusOr<UniqueFd> connection = ConnectDescriptorSocket(SocketPath());
      REQUIRE(connection.ok());
      UniqueFd a = Memfd(64), b = Memfd(64);
      absl::StatusOr<std::string> put =
          PutDescriptors(connection->get(), {a.get(), b.get()}, absl::Now() + absl::Seconds(30));
      REQUIRE(put.ok());
      token = *put;
      CHECK(socket->waiting() == 2);
    }
    REQUIRE(Eventually([&] { return socket->waiting() == 0; }));
    CHECK(absl::IsNotFound(socket->Claim(token, getpid()).status()));
  }
  CHECK(OpenDescriptors() == before);
}

TEST_CASE("a put past the limits is refused by name and keeps nothing", "[descriptors]") {
  const int before = OpenDescriptors();
  {
    auto socket = Listen(nullptr, DescriptorSocket::Limits{4, 3});
    absl::StatusOr<UniqueFd> connection = ConnectDescriptorSocket(SocketPath());
    REQUIRE(connection.ok());
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    std::vector<UniqueFd> held;
    std::vector<int> many;
    for (int i = 0; i < kMaxDescriptors + 1; ++i) {
      held.push_back(Memfd(8));
      many.push_back(held.back().get());
    }
    absl::StatusOr<std::string> too_many = PutDescriptors(connection->get(), many, deadline);
    CHECK_THAT(std::string(too_many.status().message()), Contains("more than 64 descriptors"));
    CHECK(socket->waiting() == 0);
    REQUIRE(PutDescriptors(connection->get(), {many[0], many[1]}, deadline).ok());
    absl::StatusOr<std::string> over = PutDescriptors(connection->get(), {many[2], many[3]}, deadline);
    CHECK_THAT(std::string(over.status().message()), Contains("its limit"));
    CHECK(socket->waiting() == 2);
    absl::StatusOr<std::string> empty = PutDescriptors(connection->get(), {}, deadline);
    CHECK_THAT(std::string(empty.status().message()), Contains("at least one descriptor"));
    // The socket still answers this connection after every refusal.
    absl::StatusOr<std::vector<UniqueFd>> fetched = FetchDescriptors(SocketPath(), "0123", deadline);
    CHECK_THAT(std::string(fetched.status().message()), Contains("no registry"));
  }
  CHECK(OpenDescriptors() == before);
}

TEST_CASE("a registration maps the memfd it passed; a peer fetches a target's, never a source's", "[descriptors]") {
  const int before = OpenDescriptors();
  {
    executor::HostShmBackend backend;
    Registry registry(3, {&backend});
    auto socket = Listen(&registry);
    absl::StatusOr<UniqueFd> connection = ConnectDescriptorSocket(SocketPath());
    REQUIRE(connection.ok());
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    const Peer self{getpid(), geteuid()};

    // The target: 1,000 bytes at offset 24 of a memfd, random bytes written by the client.
    UniqueFd target = Memfd(1024);
    std::vector<uint8_t> bytes(1000);
    std::mt19937 random(7);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(random());
    REQUIRE(pwrite(target.get(), bytes.data(), bytes.size(), 24) == 1000);
    absl::StatusOr<std::string> token = PutDescriptors(connection->get(), {target.get()}, deadline);
    REQUIRE(token.ok());
    ClaimedDescriptors claimed;
    claimed[*token] = *socket->Claim(*token, getpid());
    REQUIRE(registry.Add(Request("rollout", v1::TARGET, *token, 1000, 24), self, nullptr, std::move(claimed)).ok());
    std::shared_ptr<const BufferEntry> entry = registry.Find("arena-rollout");
    REQUIRE(entry);
    CHECK(std::memcmp(entry->memory->data(), bytes.data(), bytes.size()) == 0);
    // The agent writes the target; the client reads it through its own descriptor.
    std::memset(entry->memory->data(), 0x5a, 1000);
    std::vector<uint8_t> seen(1000);
    REQUIRE(pread(target.get(), seen.data(), seen.size(), 24) == 1000);
    CHECK(std::all_of(seen.begin(), seen.end(), [](uint8_t b) { return b == 0x5a; }));

    // A peer agent fetches it by its token and maps it from its registration.
    int64_t registered_at = 0;
    absl::StatusOr<v1::RegisteredBuffer> handle = registry.TargetHandle("arena-rollout", &registered_at);
    REQUIRE(handle.ok());
    absl::StatusOr<std::vector<UniqueFd>> fetched = FetchDescriptors(SocketPath(), *token, deadline);
    REQUIRE(fetched.ok());
    absl::StatusOr<std::unique_ptr<executor::MappedBuffer>> peer = registry.OpenPeer(*handle, *fetched);
    REQUIRE(peer.ok());
    (*peer)->data()[999] = 0x11;
    CHECK(entry->memory->data()[999] == 0x11);
    CHECK((*peer)->span().Overlaps(entry->memory->span()));

    // A source's descriptors are never handed out; an unknown token is named.
    UniqueFd source = Memfd(64);
    absl::StatusOr<std::string> source_token = PutDescriptors(connection->get(), {source.get()}, deadline);
    REQUIRE(source_token.ok());
    ClaimedDescriptors source_claimed;
    source_claimed[*source_token] = *socket->Claim(*source_token, getpid());
    REQUIRE(registry.Add(Request("trainer", v1::SOURCE, *source_token, 64, 0), self, nullptr, std::move(source_claimed))
                .ok());
    absl::StatusOr<std::vector<UniqueFd>> refused = FetchDescriptors(SocketPath(), *source_token, deadline);
    CHECK_THAT(std::string(refused.status().message()), Contains("is a SOURCE: peers write only targets"));
    CHECK_THAT(std::string(FetchDescriptors(SocketPath(), "feed", deadline).status().message()),
               Contains("under descriptor token 'feed'"));

    // A second registration over the same memfd's target bytes is refused, as for shm.
    absl::StatusOr<std::string> again = PutDescriptors(connection->get(), {target.get()}, deadline);
    REQUIRE(again.ok());
    ClaimedDescriptors again_claimed;
    again_claimed[*again] = *socket->Claim(*again, getpid());
    const absl::Status overlap =
        registry.Add(Request("other", v1::TARGET, *again, 8, 1000), self, nullptr, std::move(again_claimed));
    CHECK_THAT(std::string(overlap.message()), Contains("overlaps buffer 'arena-rollout'"));
    // A token with no claimed descriptors, and one too small for its claim.
    CHECK_THAT(std::string(registry.Add(Request("ghost", v1::TARGET, "abc", 8, 0), self).message()),
               Contains("descriptor token 'abc' was not claimed"));
    absl::StatusOr<std::string> small = PutDescriptors(connection->get(), {source.get()}, deadline);
    REQUIRE(small.ok());
    ClaimedDescriptors small_claimed;
    small_claimed[*small] = *socket->Claim(*small, getpid());
    CHECK_THAT(
        std::string(registry.Add(Request("small", v1::TARGET, *small, 128, 0), self, nullptr, std::move(small_claimed))
                        .message()),
        Contains("holds 64 bytes; the registration claims 128"));

    registry.Remove("rollout");
    registry.Remove("trainer");
    // A dropped target's descriptors are no longer handed out.
    CHECK_THAT(std::string(FetchDescriptors(SocketPath(), *token, deadline).status().message()),
               Contains(absl::StrCat("under descriptor token '", *token, "'")));
  }
  CHECK(OpenDescriptors() == before);
}

TEST_CASE("a read with nothing waiting says so and keeps the connection", "[descriptors]") {
  int pair[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) == 0);
  UniqueFd ours(pair[0]), theirs(pair[1]);
  std::string payload = "stale";
  std::vector<UniqueFd> descriptors;
  absl::StatusOr<bool> read = ReceiveMessage(ours.get(), &payload, &descriptors);
  REQUIRE(read.ok());
  CHECK_FALSE(*read);
  UniqueFd memfd = Memfd(64);
  REQUIRE(SendMessage(theirs.get(), "P", {memfd.get()}, 0).ok());
  read = ReceiveMessage(ours.get(), &payload, &descriptors);
  REQUIRE(read.ok());
  CHECK(*read);
  CHECK(payload == "P");
  CHECK(descriptors.size() == 1);
  theirs = UniqueFd();
  read = ReceiveMessage(ours.get(), &payload, &descriptors);
  REQUIRE(read.ok());
  CHECK(*read);
  CHECK(payload.empty());
}

}  // namespace
}  // namespace shardsync::agent
