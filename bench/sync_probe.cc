// The client's own hop, from C++: times `--syncs` syncs against a running coordinator (or
// an agent serving it) and prints one JSON line, so the sync benchmark can set it beside
// the Python client's time for the same syncs. `--wait block` is the client library's
// call (the thread sleeps until the answer); `--wait spin` polls the completion queue
// without sleeping, to measure what the caller's wake-up costs.
//   sync_probe --coordinator HOST:PORT|unix:PATH --syncs 21 --wait block|spin
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "common/flags.h"
#include "grpcpp/grpcpp.h"
#include "proto/shardsync.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;

// One sync through the async stub, the calling thread polling the queue in a loop.
grpc::Status SpinningSync(shardsync::v1::Coordinator::Stub& stub, grpc::CompletionQueue& queue,
                          shardsync::v1::SyncResponse& response) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(130));
  shardsync::v1::SyncRequest request;
  request.set_timeout_ms(120000);
  grpc::Status status;
  auto call = stub.PrepareAsyncSync(&context, request, &queue);
  call->StartCall();
  call->Finish(&response, &status, &status);
  void* tag = nullptr;
  bool ok = false;
  while (queue.AsyncNext(&tag, &ok, std::chrono::system_clock::time_point()) != grpc::CompletionQueue::GOT_EVENT) {
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  shardsync::Flags flags(argc, argv, 1);
  const std::string address = flags.Take("coordinator", "");
  const int syncs = flags.TakeNumber<int>("syncs", 21);
  const std::string wait = flags.Take("wait", "block");
  if (std::string error = flags.error().empty() ? flags.Leftover() : flags.error(); !error.empty()) {
    std::fprintf(stderr, "sync_probe: %s\n", error.c_str());
    return 2;
  }
  if (address.empty() || (wait != "block" && wait != "spin") || syncs < 1) {
    std::fprintf(stderr, "sync_probe: needs --coordinator ADDRESS, --wait block|spin, --syncs N >= 1\n");
    return 2;
  }
  shardsync::TlsConfig tls;
  tls.insecure = true;
  const auto plaintext = shardsync::LoadCredentials(tls);
  if (!plaintext.ok()) {
    std::fprintf(stderr, "sync_probe: %s\n", plaintext.status().ToString().c_str());
    return 1;
  }
  shardsync::client::CoordinatorClient client(address, *plaintext);
  auto stub = shardsync::v1::Coordinator::NewStub(shardsync::MakeChannel(address, *plaintext));
  grpc::CompletionQueue queue;
  std::vector<double> seconds, coordinator;
  for (int i = 0; i <= syncs; ++i) {  // the first is a warm-up of this client's channel
    shardsync::v1::SyncResponse response;
    const auto start = Clock::now();
    if (wait == "block") {
      auto answer = client.Sync(absl::Seconds(120));
      if (!answer.ok()) {
        std::fprintf(stderr, "sync_probe: %s\n", answer.status().ToString().c_str());
        return 1;
      }
      response = *std::move(answer);
    } else if (grpc::Status status = SpinningSync(*stub, queue, response); !status.ok()) {
      std::fprintf(stderr, "sync_probe: %s\n", status.error_message().c_str());
      return 1;
    }
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (i == 0) continue;
    seconds.push_back(elapsed);
    coordinator.push_back(response.seconds());
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("{\"wait\": \"%s\", \"seconds\": %.9f, \"coordinator\": %.9f, \"all_seconds\": [", wait.c_str(),
              median(seconds), median(coordinator));
  for (size_t i = 0; i < seconds.size(); ++i) std::printf("%s%.9f", i ? ", " : "", seconds[i]);
  std::printf("]}\n");
  queue.Shutdown();
  return 0;
}
