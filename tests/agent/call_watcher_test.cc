// The agent's CallWatcher against a real gRPC server: an Execute whose caller goes away
// has its sync named once, and one that ends normally is never named.
#include "daemon/agent/call_watcher.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "proto/shardsync.grpc.pb.h"

namespace shardsync::agent {
namespace {

// Execute watched from its start until released or, its caller gone, until the
// watcher has named its sync.
class WatchedExecute final : public v1::AgentControl::Service {
 public:
  grpc::Status Execute(grpc::ServerContext* context, const v1::ExecuteRequest* request, v1::ExecuteResponse*) override {
    watcher.Watch(context, request->sync_id());
    arrived.Notify();
    const auto over = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return released || !ended.empty(); };
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(&over));
    }
    watcher.Forget(context);
    return grpc::Status::OK;
  }

  absl::Mutex mu;
  bool released ABSL_GUARDED_BY(mu) = false;
  std::vector<std::string> ended ABSL_GUARDED_BY(mu);
  absl::Notification arrived;
  CallWatcher watcher{[this](const std::string& sync_id) {
    absl::MutexLock lock(&mu);
    ended.push_back(sync_id);
  }};
};

struct Server {
  Server() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    REQUIRE(port > 0);
    stub = v1::AgentControl::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  }
  ~Server() {
    {
      absl::MutexLock lock(&service.mu);
      service.released = true;
    }
    server->Shutdown();
  }
  WatchedExecute service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1::AgentControl::Stub> stub;
};

TEST_CASE("an Execute whose caller went away has its sync named once; one that ended is not") {
  Server agent;
  v1::ExecuteRequest request;
  request.set_sync_id("sync-7");
  grpc::ClientContext cancelled;
  v1::ExecuteResponse response;
  std::thread caller([&] { agent.stub->Execute(&cancelled, request, &response); });
  agent.service.arrived.WaitForNotification();
  cancelled.TryCancel();
  caller.join();
  {
    absl::MutexLock lock(&agent.service.mu);
    const auto named = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(agent.service.mu) { return !agent.service.ended.empty(); };
    // Deadline only a hang exceeds: the watcher looks every 20 ms.
    REQUIRE(agent.service.mu.AwaitWithTimeout(absl::Condition(&named), absl::Seconds(60)));
    CHECK(agent.service.ended == std::vector<std::string>{"sync-7"});
  }

  // A second call that its handler ends itself: never named.
  Server quiet;
  grpc::ClientContext normal;
  grpc::Status answered;
  std::thread second([&] { answered = quiet.stub->Execute(&normal, request, &response); });
  quiet.service.arrived.WaitForNotification();
  {
    absl::MutexLock lock(&quiet.service.mu);
    quiet.service.released = true;
  }
  second.join();
  CHECK(answered.ok());
  absl::SleepFor(absl::Milliseconds(60));  // three of the watcher's looks
  absl::MutexLock lock(&quiet.service.mu);
  CHECK(quiet.service.ended.empty());
}

}  // namespace
}  // namespace shardsync::agent
