// Aborts a sync whose coordinator call ended early (its connection lost: keepalive finds
// a cut link within seconds), since nobody else can abort it any more. One thread for
// the agent checks the calls in flight every 20 ms, and sleeps while there is none; a
// call costs a map entry, not a thread.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"

namespace shardsync::agent {

class CallWatcher {
 public:
  // `on_ended(sync_id)` runs on the watcher's thread, without its lock.
  explicit CallWatcher(std::function<void(const std::string& sync_id)> on_ended);
  ~CallWatcher();
  CallWatcher(const CallWatcher&) = delete;
  CallWatcher& operator=(const CallWatcher&) = delete;

  // From the call's start until Forget: `context` must live until then.
  void Watch(grpc::ServerContext* context, const std::string& sync_id);
  void Forget(grpc::ServerContext* context);

 private:
  void Run();

  const std::function<void(const std::string&)> on_ended_;
  absl::Mutex mu_;
  std::map<grpc::ServerContext*, std::string> calls_ ABSL_GUARDED_BY(mu_);  // by context: its sync
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the rest is made
};

}  // namespace shardsync::agent
