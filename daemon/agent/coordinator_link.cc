#include "daemon/agent/coordinator_link.h"

#include "common/contract_id.h"
#include "common/unguessable.h"
#include "grpcpp/grpcpp.h"
#include "spdlog/spdlog.h"

namespace shardsync::agent {

std::string NewIncarnation() { return UnguessableHex(); }

CoordinatorLink::CoordinatorLink(LinkConfig config, Registry& registry)
    : config_(std::move(config)), registry_(registry) {}

CoordinatorLink::~CoordinatorLink() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void CoordinatorLink::Start(const std::string& address) {
  config_.join.set_address(address);
  config_.join.set_contract(kContractId);
  if (config_.coordinator.empty()) config_.coordinator = address;  // this agent serves it
  stub_ = v1::Coordinator::NewStub(MakeChannel(config_.coordinator, config_.credentials));
  thread_ = std::thread([this] { Loop(); });
}

void CoordinatorLink::Nudge() {
  absl::MutexLock lock(&mu_);
  nudged_ = true;
}

bool CoordinatorLink::joined() const {
  absl::MutexLock lock(&mu_);
  return joined_;
}

int64_t CoordinatorLink::WaitPublished(int64_t version, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  const auto published = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return published_version_ >= version; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&published), deadline)) return -1;
  return epoch_;
}

void CoordinatorLink::SetTargetVersion(const std::string& version) {
  absl::MutexLock lock(&mu_);
  if (target_version_ == version) return;
  // A new version of valid targets waits for the next Join: the coordinator learns it
  // from the sync that wrote them.
  if (target_version_.empty() || version.empty()) nudged_ = true;  // say it at once
  target_version_ = version;
}

void CoordinatorLink::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      const auto wake = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || nudged_; };
      mu_.AwaitWithTimeout(absl::Condition(&wake), joined_ ? config_.heartbeat : absl::Milliseconds(200));
      if (stop_) return;
      nudged_ = false;
    }
    // Join doubles as the heartbeat: a new instance id means the coordinator restarted.
    grpc::ClientContext join_context;
    join_context.set_deadline(absl::ToChronoTime(absl::Now() + config_.rpc_deadline));
    v1::JoinRequest join_request = config_.join;
    {
      absl::MutexLock lock(&mu_);
      join_request.set_target_version(target_version_);
    }
    v1::JoinResponse joined;
    const grpc::Status join = stub_->Join(&join_context, join_request, &joined);
    int64_t published = -1;
    {
      absl::MutexLock lock(&mu_);
      if (!join.ok()) {
        // Said once per reason: a wrong certificate or a coordinator that is gone.
        if (join.error_message() != join_error_) {
          spdlog::warn("cannot join coordinator {}: {}", config_.coordinator, join.error_message());
        }
        join_error_ = join.error_message();
        joined_ = false;
        continue;
      }
      join_error_.clear();
      if (!joined_ || joined.instance_id() != instance_) {
        spdlog::info("joined coordinator {} (instance {})", config_.coordinator, joined.instance_id());
        published_version_ = -1;  // a new coordinator knows nothing: publish again
      }
      if (!joined.published()) published_version_ = -1;  // it dropped or never had ours
      joined_ = true;
      instance_ = joined.instance_id();
      published = published_version_;
    }
    if (registry_.version() == published) continue;
    v1::PublishRequest request;
    request.set_rank(config_.join.rank());
    request.set_incarnation(config_.join.incarnation());
    {
      absl::MutexLock lock(&mu_);
      request.set_target_version(target_version_);
    }
    int64_t version = 0;
    for (v1::PublishedLayout& layout : registry_.Layouts(&version)) *request.add_layouts() = std::move(layout);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + config_.rpc_deadline));
    v1::PublishResponse response;
    const grpc::Status status = stub_->Publish(&context, request, &response);
    absl::MutexLock lock(&mu_);
    if (!status.ok()) {
      spdlog::warn("publishing layouts failed: {}", status.error_message());
      joined_ = false;
      continue;
    }
    published_version_ = version;
    epoch_ = response.layout_epoch();
    nudged_ = nudged_ || registry_.version() != version;
  }
}

}  // namespace shardsync::agent
