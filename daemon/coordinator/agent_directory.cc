#include "daemon/coordinator/agent_directory.h"

#include <malloc.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/contract_id.h"
#include "common/metrics_http.h"
#include "common/status_macros.h"
#include "daemon/coordinator/layouts.h"
#include "spdlog/spdlog.h"

namespace shardsync::coordinator {
namespace {

constexpr size_t kMaxNameBytes = 1024;  // hosts, addresses, devices, nodes, boards, incarnations, ids
constexpr int kMaxPeerDevices = 1024;   // JoinRequest.peer_device_uuids

absl::Status CheckRank(int32_t rank, int32_t world) {
  if (rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is outside a world of ", world));
  }
  return absl::OkStatus();
}

// A name the request must carry (`required`), at most kMaxNameBytes long.
absl::Status CheckName(const char* what, const std::string& value, bool required) {
  if (required && value.empty()) return absl::InvalidArgumentError(absl::StrCat("the request has no ", what));
  if (value.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request's ", what, " is ", value.size(), " bytes; at most ", kMaxNameBytes));
  }
  return absl::OkStatus();
}

absl::Status CheckJoin(const v1::JoinRequest& request, int32_t world) {
  SHARDSYNC_RETURN_IF_ERROR(CheckRank(request.rank(), world));
  SHARDSYNC_RETURN_IF_ERROR(CheckName("address", request.address(), true));
  SHARDSYNC_RETURN_IF_ERROR(CheckName("incarnation", request.incarnation(), true));
  SHARDSYNC_RETURN_IF_ERROR(CheckName("host", request.host(), false));
  SHARDSYNC_RETURN_IF_ERROR(CheckName("device", request.device(), false));
  SHARDSYNC_RETURN_IF_ERROR(CheckName("device uuid", request.device_uuid(), false));
  SHARDSYNC_RETURN_IF_ERROR(CheckName("signal board", request.signal_board(), false));
  SHARDSYNC_RETURN_IF_ERROR(CheckName("contract", request.contract(), false));
  if (request.peer_device_uuids_size() > kMaxPeerDevices) {
    return absl::InvalidArgumentError(absl::StrCat("the request names ", request.peer_device_uuids_size(),
                                                   " peer devices; at most ", kMaxPeerDevices));
  }
  for (const std::string& uuid : request.peer_device_uuids()) {
    SHARDSYNC_RETURN_IF_ERROR(CheckName("peer device uuid", uuid, true));
  }
  return CheckName("node", request.node(), false);
}

absl::Status CheckPublish(const v1::PublishRequest& request, int32_t world, int64_t max_tensors) {
  SHARDSYNC_RETURN_IF_ERROR(CheckRank(request.rank(), world));
  SHARDSYNC_RETURN_IF_ERROR(CheckName("incarnation", request.incarnation(), true));
  int64_t tensors = 0;
  for (const v1::PublishedLayout& layout : request.layouts()) tensors += layout.tensors_size();
  if (tensors > max_tensors) {
    return absl::ResourceExhaustedError(absl::StrCat("rank ", request.rank(), " published ", tensors,
                                                     " tensors, past the coordinator's limit ", max_tensors,
                                                     " (--max-tensors)"));
  }
  for (const v1::PublishedLayout& layout : request.layouts()) {
    SHARDSYNC_RETURN_IF_ERROR(CheckName("client id", layout.client_id(), true));
    if (layout.role() != v1::SOURCE && layout.role() != v1::TARGET) {
      return absl::InvalidArgumentError(absl::StrCat("client '", layout.client_id(), "' has no role"));
    }
    for (const v1::BufferInfo& b : layout.buffers()) {
      SHARDSYNC_RETURN_IF_ERROR(CheckName("buffer name", b.name(), true));
      if (b.bytes() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("buffer '", b.name(), "' of client '", layout.client_id(), "' has ", b.bytes(), " bytes"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckIdentity(int32_t rank, const std::string& tied, const std::string& identity) {
  if (identity == tied) return absl::OkStatus();
  const auto named = [](const std::string& id) { return id.empty() ? std::string("no certificate") : "'" + id + "'"; };
  return absl::PermissionDeniedError(absl::StrCat("rank ", rank, " is tied to ", named(tied),
                                                  " (its first Join's certificate); this call presents ",
                                                  named(identity)));
}

}  // namespace

AgentDirectory::AgentDirectory(int32_t world_size, int64_t max_tensors, Credentials credentials,
                               std::string instance_id)
    : world_size_(world_size),
      max_tensors_(max_tensors),
      credentials_(std::move(credentials)),
      instance_id_(std::move(instance_id)) {}

void AgentDirectory::SetLocalAgent(const std::string& incarnation, std::shared_ptr<AgentLink> link) {
  absl::MutexLock lock(&mu_);
  local_incarnation_ = incarnation;
  local_link_ = std::move(link);
}

absl::StatusOr<AgentDirectory::Joined> AgentDirectory::Join(const v1::JoinRequest& request,
                                                            const std::string& identity) {
  SHARDSYNC_RETURN_IF_ERROR(CheckJoin(request, world_size_));
  absl::MutexLock lock(&mu_);
  const auto held = agents_.find(request.rank());
  if (held != agents_.end()) SHARDSYNC_RETURN_IF_ERROR(CheckIdentity(request.rank(), held->second.identity, identity));
  if (request.contract() != kContractId) {
    const std::string why = absl::StrCat(
        "rank ", request.rank(), "'s agent (at ", request.address(), ") is of another build: its contract is ",
        request.contract().empty() ? "none (a build older than contract ids)" : request.contract(),
        ", this coordinator's ", kContractId,
        "; every daemon of a deployment runs one build (docs/operations.md, Upgrading)");
    refused_[request.rank()] = why;
    return absl::FailedPreconditionError(why);
  }
  refused_.erase(request.rank());
  Entry& entry = agents_[request.rank()];
  if (held == agents_.end()) entry.identity = identity;
  const absl::Duration silent = absl::Now() - entry.last_seen;
  const bool new_incarnation = entry.link && entry.join.incarnation() != request.incarnation();
  if (new_incarnation && silent < kAgentLiveness) {
    return absl::AlreadyExistsError(absl::StrCat("rank ", request.rank(), " belongs to a live agent (at ",
                                                 entry.join.address(), ", seen ", absl::FormatDuration(silent),
                                                 " ago); another may take it once that one has been silent for ",
                                                 absl::FormatDuration(kAgentLiveness)));
  }
  Joined joined;
  if (new_incarnation) {
    // A new agent process: whatever the old one published died with it.
    spdlog::info("rank {} restarted; its old layouts are dropped", request.rank());
    if (published_.erase(request.rank()) > 0) ++epoch_;
    joined.restarted = true;
  }
  if (!entry.link || entry.join.address() != request.address() || new_incarnation) {
    if (entry.link) spdlog::info("rank {} rejoined at {}", request.rank(), request.address());
    ++membership_version_;  // a returning agent needs a new communicator
    const bool local = local_link_ && request.incarnation() == local_incarnation_;
    entry.link = local ? local_link_
                       : GrpcAgentLink(request.address(), credentials_, absl::StartsWith(request.device(), "cuda"));
    spdlog::info("rank {} joined from {} ({}{})", request.rank(), request.address(), request.device(),
                 local ? ", in this process" : "");
  }
  entry.join = request;
  entry.last_seen = absl::Now();
  joined.response.set_world_size(world_size_);
  joined.response.set_instance_id(instance_id_);
  const auto publication = published_.find(request.rank());
  joined.response.set_published(publication != published_.end() &&
                                publication->second.incarnation() == request.incarnation());
  return joined;
}

absl::StatusOr<int64_t> AgentDirectory::Publish(const v1::PublishRequest& request, const std::string& identity) {
  SHARDSYNC_RETURN_IF_ERROR(CheckPublish(request, world_size_, max_tensors_));
  v1::PublishRequest replaced;  // freed after the lock
  const absl::StatusOr<int64_t> epoch = Replace(request, identity, replaced);
  replaced.Clear();
  // A large publication replaced leaves free heap that malloc would keep.
  if (epoch.ok()) malloc_trim(0);
  return epoch;
}

absl::StatusOr<int64_t> AgentDirectory::Replace(const v1::PublishRequest& request, const std::string& identity,
                                                v1::PublishRequest& replaced) {
  absl::MutexLock lock(&mu_);
  const auto agent = agents_.find(request.rank());
  if (agent == agents_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", request.rank(), " published before it joined"));
  }
  SHARDSYNC_RETURN_IF_ERROR(CheckIdentity(request.rank(), agent->second.identity, identity));
  if (agent->second.join.incarnation() != request.incarnation()) {
    // Neither incarnation is named: the live one is a credential, the other a guess.
    return absl::PermissionDeniedError(
        absl::StrCat("rank ", request.rank(), " belongs to another incarnation than the publisher's"));
  }
  // Swapped in whole, not assigned: assigning keeps the old message's cleared repeated
  // fields allocated, and a publication can hold 100k tensors.
  v1::PublishRequest fresh(request);
  published_[request.rank()].Swap(&fresh);
  replaced.Swap(&fresh);
  agent->second.join.set_target_version(request.target_version());  // its word, newer than its last Join
  ++epoch_;
  spdlog::info("rank {} published {} layouts; layout epoch {}", request.rank(), request.layouts_size(), epoch_);
  return epoch_;
}

int64_t AgentDirectory::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

int64_t AgentDirectory::membership_version() const {
  absl::MutexLock lock(&mu_);
  return membership_version_;
}

std::map<int32_t, v1::PublishRequest> AgentDirectory::Published(int64_t* epoch) const {
  absl::MutexLock lock(&mu_);
  *epoch = epoch_;
  return published_;
}

std::vector<int32_t> AgentDirectory::NodeOfRank() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, int32_t> index;
  std::vector<int32_t> nodes(world_size_, 0);
  for (const auto& [rank, entry] : agents_) {
    const std::string& node = entry.join.node().empty() ? entry.join.host() : entry.join.node();
    nodes[rank] = index.emplace(node, static_cast<int32_t>(index.size())).first->second;
  }
  return nodes;
}

std::map<int32_t, std::shared_ptr<AgentLink>> AgentDirectory::Links() const {
  absl::MutexLock lock(&mu_);
  std::map<int32_t, std::shared_ptr<AgentLink>> links;
  for (const auto& [rank, entry] : agents_) links[rank] = entry.link;
  return links;
}

AgentDirectory::Contacts AgentDirectory::CurrentContacts() const {
  absl::MutexLock lock(&mu_);
  Contacts contacts;
  for (const auto& [rank, entry] : agents_) {
    contacts.links[rank] = entry.link;
    contacts.addresses[rank] = entry.join.address();
    contacts.all_agree_fast = contacts.all_agree_fast && entry.join.fast_agreement();
    contacts.host_copies = contacts.host_copies || entry.join.device() == "cpu";
  }
  return contacts;
}

std::vector<v1::JoinRequest> AgentDirectory::Joins() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::JoinRequest> joins(world_size_);
  for (const auto& [rank, entry] : agents_) joins[rank] = entry.join;
  return joins;
}

std::vector<int32_t> AgentDirectory::MissingRanks() const {
  absl::MutexLock lock(&mu_);
  std::vector<int32_t> missing;
  for (int32_t r = 0; r < world_size_; ++r) {
    if (!agents_.count(r)) missing.push_back(r);
  }
  return missing;
}

std::map<int32_t, std::string> AgentDirectory::RefusedJoins() const {
  absl::MutexLock lock(&mu_);
  std::map<int32_t, std::string> refused;
  for (const auto& [rank, why] : refused_) {
    const auto held = agents_.find(rank);
    if (held == agents_.end() || absl::Now() - held->second.last_seen >= kAgentLiveness) refused[rank] = why;
  }
  return refused;
}

std::vector<int32_t> AgentDirectory::TargetRanks() const {
  absl::MutexLock lock(&mu_);
  return coordinator::TargetRanks(published_);
}

std::map<int32_t, std::string> AgentDirectory::TargetVersionsByOwnWord() const {
  absl::MutexLock lock(&mu_);
  std::map<int32_t, std::string> versions;
  for (int32_t rank : coordinator::TargetRanks(published_)) {
    const auto agent = agents_.find(rank);
    if (agent == agents_.end()) continue;
    versions[rank] = agent->second.join.target_version();
  }
  return versions;
}

void AgentDirectory::FillStatus(v1::CoordinatorStatus* status) const {
  absl::MutexLock lock(&mu_);
  status->set_world_size(world_size_);
  status->set_layout_epoch(epoch_);
  for (const auto& [rank, entry] : agents_) {
    v1::AgentInfo* info = status->add_agents();
    info->set_rank(rank);
    info->set_host(entry.join.host());
    info->set_node(entry.join.node().empty() ? entry.join.host() : entry.join.node());
    info->set_address(entry.join.address());
    info->set_device(entry.join.device());
    info->set_reachable(absl::Now() - entry.last_seen < kAgentLiveness);
    info->set_seconds_since_seen(absl::ToDoubleSeconds(absl::Now() - entry.last_seen));
    const auto published = published_.find(rank);
    info->set_clients(published == published_.end() ? 0 : published->second.layouts_size());
  }
}

void AgentDirectory::AppendMetrics(std::string* out) const {
  absl::MutexLock lock(&mu_);
  AppendMetric(out, "shardsync_layout_epoch", "gauge", "Layout epoch (changes with every publication).", epoch_);
  AppendMetric(out, "shardsync_agents", "gauge", "Agents joined.", static_cast<double>(agents_.size()));
  int64_t buffers = 0, bytes = 0;
  for (const auto& [rank, publication] : published_) {
    for (const v1::PublishedLayout& layout : publication.layouts()) {
      buffers += layout.buffers_size();
      for (const v1::BufferInfo& b : layout.buffers()) bytes += b.bytes();
    }
  }
  AppendMetric(out, "shardsync_registered_buffers", "gauge", "Buffers registered on all agents.", buffers);
  AppendMetric(out, "shardsync_registered_bytes", "gauge", "Bytes of the buffers registered on all agents.", bytes);
}

}  // namespace shardsync::coordinator
