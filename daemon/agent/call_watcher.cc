#include "daemon/agent/call_watcher.h"

#include <vector>

#include "absl/time/time.h"

namespace shardsync::agent {

CallWatcher::CallWatcher(std::function<void(const std::string&)> on_ended)
    : on_ended_(std::move(on_ended)), thread_([this] { Run(); }) {}

CallWatcher::~CallWatcher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void CallWatcher::Watch(grpc::ServerContext* context, const std::string& sync_id) {
  absl::MutexLock lock(&mu_);
  calls_[context] = sync_id;
}

void CallWatcher::Forget(grpc::ServerContext* context) {
  absl::MutexLock lock(&mu_);
  calls_.erase(context);
}

void CallWatcher::Run() {
  absl::MutexLock lock(&mu_);
  const auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
  const auto busy = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !calls_.empty(); };
  while (true) {
    mu_.Await(absl::Condition(&busy));
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping), absl::Milliseconds(20))) return;
    std::vector<std::string> ended;
    for (auto it = calls_.begin(); it != calls_.end();) {
      if (it->first->IsCancelled()) {
        ended.push_back(it->second);
        it = calls_.erase(it);  // aborted once
      } else {
        ++it;
      }
    }
    if (ended.empty()) continue;
    mu_.Unlock();
    for (const std::string& sync_id : ended) on_ended_(sync_id);
    mu_.Lock();
  }
}

}  // namespace shardsync::agent
