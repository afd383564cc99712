#include "tools/localsync/deployment.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"

namespace shardsync::localsync {

Deployment::Deployment(Cluster& cluster, const std::string& name, const std::string& spec_json, uint64_t seed,
                       int extra_rank, const std::string& extra_flags)
    : cluster_(cluster), poison_(seed), spec_path_(cluster.dir() + "/" + name + ".json") {
  const std::string& path = spec_path_;
  std::ofstream(path) << spec_json;
  auto spec = spec::ParseLayoutSpecJson(spec_json);
  if (!spec.ok()) throw std::runtime_error(std::string(spec.status().message()));
  auto input = spec::ToPlanInput(*spec, ids_);
  if (!input.ok()) throw std::runtime_error(std::string(input.status().message()));
  input_ = *std::move(input);
  std::map<int, std::pair<bool, bool>> sides;  // rank -> (holds sources, holds targets)
  for (const planner::TensorLayouts& t : input_.tensors) {
    for (const planner::Placement& p : t.source.placements) sides[p.holder.rank].first = true;
    for (const planner::Placement& p : t.target.placements) sides[p.holder.rank].second = true;
  }
  for (const auto& [rank, side] : sides) {
    if (side.first) {
      trainers_[rank] = cluster.StartClient(path, rank, true, seed, rank == extra_rank ? extra_flags : "");
    }
    if (side.second) rollouts_[rank] = cluster.StartClient(path, rank, false, seed);
  }
}

Deployment::~Deployment() {
  for (auto* clients : {&trainers_, &rollouts_}) {
    for (auto& [rank, client] : *clients) client.process->WriteLine("exit");
    for (auto& [rank, client] : *clients) client.process->Wait(absl::Seconds(5));
  }
  // Wait until every agent has dropped the registrations, so the next deployment can
  // register the same buffer names.
  for (int rank = 0; rank < 64; ++rank) {
    if (access(cluster_.socket(rank).c_str(), F_OK) != 0) break;
    client::AgentClient agent(cluster_.socket(rank));
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline) {
      auto status = agent.Status(absl::Seconds(1));
      if (!status.ok() || status->clients_size() == 0) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
}

std::vector<std::string> Deployment::WaitReady() {
  std::vector<std::string> lines;
  bool all_ready = true;
  for (auto* clients : {&trainers_, &rollouts_}) {
    for (auto& [rank, client] : *clients) {
      lines.push_back(client.process->ReadLine(absl::Seconds(20)));
      all_ready = all_ready && lines.back().rfind("ready", 0) == 0;
    }
  }
  if (all_ready && !WaitPublished()) lines.push_back("the coordinator never saw every client published");
  return lines;
}

bool Deployment::WaitPublished() {
  // A client is ready once its agent holds it; the agent publishes to the coordinator
  // on its own thread. Wait until the coordinator shows every rank's clients.
  std::map<int, int> expected;
  for (auto* clients : {&trainers_, &rollouts_}) {
    for (auto& [rank, client] : *clients) ++expected[rank];
  }
  return WaitCoordinatorShows(expected);
}

bool Deployment::WaitCoordinatorShows(const std::map<int, int>& expected) {
  client::CoordinatorClient coordinator = cluster_.coordinator_client();
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    auto status = coordinator.Status(absl::Seconds(2));
    int published = 0;
    if (status.ok()) {
      for (const v1::AgentInfo& agent : status->agents()) {
        auto it = expected.find(agent.rank());
        published += it != expected.end() && agent.clients() == it->second;
      }
    }
    if (published == static_cast<int>(expected.size())) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

void Deployment::Refill(uint64_t seed) {
  for (auto& [rank, client] : trainers_) client.process->WriteLine(absl::StrCat("refill ", seed, " ", changed_));
  for (auto& [rank, client] : trainers_) client.process->ReadLine(absl::Seconds(20));
}

std::string Deployment::RestartRollout(int rank) {
  Cluster::Client& rollout = rollouts_.at(rank);
  rollout.process->Signal(SIGKILL);
  rollout.process->Wait(absl::Seconds(5));
  // First the coordinator sees the old registration gone, so the ready state below is
  // the new one's, not the old one's still published.
  std::map<int, int> expected;
  for (auto* clients : {&trainers_, &rollouts_}) {
    for (auto& [r, client] : *clients) ++expected[r];
  }
  --expected[rank];
  if (!WaitCoordinatorShows(expected)) return "the coordinator never saw the old rollout leave";
  rollout = cluster_.StartClient(spec_path_, rank, false, poison_);
  const std::string line = rollout.process->ReadLine(absl::Seconds(20));
  ++expected[rank];
  if (line.rfind("ready", 0) == 0 && !WaitCoordinatorShows(expected)) return "the coordinator never saw it publish";
  return line;
}

std::string Deployment::RolloutAddress(int rank) {
  Process& process = *rollouts_.at(rank).process;
  process.WriteLine("address");
  return process.ReadLine(absl::Seconds(10));
}

// Maps buffer `b` of the client of its rank read-only and calls fn(bytes, size).
template <typename Fn>
bool WithBuffer(const std::map<int, Cluster::Client>& clients, const planner::Buffer& b, const std::string& buffer_name,
                Fn&& fn) {
  auto client = clients.find(b.holder.rank);
  if (client == clients.end()) return false;
  const std::string name = absl::StrCat(client->second.shm_prefix, "-r", b.holder.rank, "-", buffer_name);
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  const size_t size = static_cast<size_t>(std::max<int64_t>(b.bytes, 1));
  void* data = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (data == MAP_FAILED) return false;
  fn(static_cast<const uint8_t*>(data), b.bytes);
  munmap(data, size);
  return true;
}

std::vector<planner::Buffer> Deployment::TargetBuffers() const {
  std::vector<planner::Buffer> buffers;
  for (const planner::Buffer& b : input_.buffers) {
    if (ids_.Name(b.holder.buffer) == "arena") buffers.push_back(b);
  }
  return buffers;
}

Contents Deployment::ReadTargets() const {
  Contents contents;
  for (const planner::Buffer& b : TargetBuffers()) {
    WithBuffer(rollouts_, b, "arena",
               [&](const uint8_t* data, int64_t bytes) { contents[b.holder].assign(data, data + bytes); });
  }
  return contents;
}

std::vector<std::string> Deployment::CheckTargets(uint64_t seed, const std::set<int>& ranks) const {
  std::vector<std::string> errors;
  for (const planner::Buffer& b : TargetBuffers()) {
    if (!ranks.empty() && !ranks.count(b.holder.rank)) continue;
    const std::vector<uint8_t> expected = ExpectedTarget(input_, StepOf(seed), poison_, b.holder);
    const bool read = WithBuffer(rollouts_, b, "arena", [&](const uint8_t* data, int64_t bytes) {
      for (int64_t i = 0; i < bytes; ++i) {
        if (data[i] != expected[i]) {
          errors.push_back(absl::StrCat("rank ", b.holder.rank, " arena byte ", i, " differs"));
          return;
        }
      }
    });
    if (!read) errors.push_back(absl::StrCat("rank ", b.holder.rank, ": target buffer not readable"));
  }
  return errors;
}

std::vector<std::string> Deployment::CheckSources(uint64_t seed) const {
  std::vector<std::string> errors;
  for (const auto& [rank, trainer] : trainers_) {
    Contents expected;
    for (const planner::Buffer& b : input_.buffers) {
      if (b.holder.rank == rank && ids_.Name(b.holder.buffer) != "arena") expected[b.holder].resize(b.bytes);
    }
    WriteSources(input_, StepOf(seed), rank, [&](planner::Holder holder) { return expected.at(holder).data(); });
    for (const planner::Buffer& b : input_.buffers) {
      if (!expected.count(b.holder)) continue;
      const bool read = WithBuffer(trainers_, b, ids_.Name(b.holder.buffer), [&](const uint8_t* data, int64_t bytes) {
        if (std::memcmp(data, expected.at(b.holder).data(), bytes) != 0) {
          errors.push_back(
              absl::StrCat("rank ", b.holder.rank, " source buffer ", ids_.Name(b.holder.buffer), " changed"));
        }
      });
      if (!read) errors.push_back(absl::StrCat("rank ", rank, ": source buffer not readable"));
    }
  }
  return errors;
}

int64_t Deployment::MismatchedBytes(uint64_t seed) const {
  int64_t mismatched = 0;
  for (const planner::Buffer& b : TargetBuffers()) {
    const std::vector<uint8_t> expected = ExpectedTarget(input_, StepOf(seed), poison_, b.holder);
    const bool read = WithBuffer(rollouts_, b, "arena", [&](const uint8_t* data, int64_t bytes) {
      for (int64_t i = 0; i < bytes; ++i) mismatched += data[i] != expected[i];
    });
    if (!read) mismatched += b.bytes;
  }
  return mismatched;
}

absl::StatusOr<v1::SyncResponse> SyncOnce(const Cluster& cluster, absl::Duration timeout, bool verify) {
  v1::SyncRequest request;
  request.set_verify(verify);
  return SyncOnce(cluster, std::move(request), timeout);
}

absl::StatusOr<v1::SyncResponse> SyncOnce(const Cluster& cluster, v1::SyncRequest request, absl::Duration timeout) {
  client::CoordinatorClient coordinator = cluster.coordinator_client();
  return coordinator.Sync(std::move(request), timeout);
}

}  // namespace shardsync::localsync
