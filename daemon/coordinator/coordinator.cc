#include "daemon/coordinator/coordinator.h"

#include "absl/strings/str_cat.h"
#include "common/metrics_http.h"
#include "common/status_macros.h"

namespace shardsync::coordinator {
namespace {

std::string NewInstanceId() { return absl::StrCat(absl::ToUnixNanos(absl::Now())); }

SyncOptions SyncOptionsOf(const CoordinatorConfig& config) {
  SyncOptions options;
  options.epoch.world_size = config.world_size;
  options.epoch.relay = config.relay;
  options.direct = config.direct;
  options.delta = config.delta;
  options.epoch.bandwidths = config.bandwidths;
  options.epoch.staging_bytes = config.staging_bytes;
  options.epoch.scratch_bytes = config.scratch_bytes;
  options.epoch.shared_source_uids = config.shared_source_uids;
  options.epoch.plan_dir = config.plan_dir;
  options.rpc_deadline = config.rpc_deadline;
  options.sync_timeout = config.sync_timeout;
  return options;
}

}  // namespace

Coordinator::Coordinator(CoordinatorConfig config)
    : config_(std::move(config)),
      directory_(config_.world_size, config_.max_tensors, config_.credentials, NewInstanceId()),
      runner_(SyncOptionsOf(config_), directory_.instance_id(), directory_, validity_) {}

void Coordinator::SetLocalAgent(const std::string& incarnation, std::shared_ptr<AgentLink> link) {
  directory_.SetLocalAgent(incarnation, std::move(link));
}

absl::StatusOr<v1::JoinResponse> Coordinator::Join(const v1::JoinRequest& request, const std::string& identity) {
  AgentDirectory::Joined joined;
  {
    absl::MutexLock lock(&membership_mu_);
    SHARDSYNC_ASSIGN_OR_RETURN(joined, directory_.Join(request, identity));
    if (joined.restarted) validity_.Restarted(request.rank());
  }
  if (joined.restarted) runner_.ReleaseStalePlans();  // the old agent's layouts are gone
  return std::move(joined.response);
}

absl::StatusOr<v1::PublishResponse> Coordinator::Publish(const v1::PublishRequest& request,
                                                         const std::string& identity) {
  int64_t epoch = 0;
  {
    absl::MutexLock lock(&membership_mu_);
    SHARDSYNC_ASSIGN_OR_RETURN(epoch, directory_.Publish(request, identity));
    validity_.Republished(request.rank());
  }
  runner_.ReleaseStalePlans();
  v1::PublishResponse response;
  response.set_layout_epoch(epoch);
  return response;
}

std::set<int32_t> Coordinator::InvalidTargetRanks() const {
  absl::MutexLock lock(&membership_mu_);
  return validity_.Invalid(directory_.TargetVersionsByOwnWord());
}

v1::CoordinatorStatus Coordinator::Status() const {
  v1::CoordinatorStatus status;
  status.set_sync_timeout_ms(absl::ToInt64Milliseconds(config_.sync_timeout));
  runner_.FillStatus(&status);
  directory_.FillStatus(&status);
  std::map<int32_t, std::string> versions;
  {
    absl::MutexLock lock(&membership_mu_);
    versions = validity_.Versions(directory_.TargetVersionsByOwnWord());
  }
  for (v1::AgentInfo& agent : *status.mutable_agents()) {
    if (const auto version = versions.find(agent.rank()); version != versions.end()) {
      agent.set_target_version(version->second);
    }
  }
  const std::set<int32_t> invalid = InvalidTargetRanks();
  status.set_targets_valid(invalid.empty());
  status.mutable_invalid_target_ranks()->Add(invalid.begin(), invalid.end());
  return status;
}

std::string Coordinator::Metrics() const {
  std::string out;
  runner_.AppendMetrics(&out);
  const std::set<int32_t> invalid = InvalidTargetRanks();
  AppendMetric(&out, "shardsync_targets_valid", "gauge",
               "1 unless some rank's targets do not hold a completed sync's bytes.", invalid.empty());
  AppendMetric(&out, "shardsync_invalid_target_ranks", "gauge", "Ranks whose targets are invalid.",
               static_cast<double>(invalid.size()));
  directory_.AppendMetrics(&out);
  return out;
}

}  // namespace shardsync::coordinator
