// C++ client library: register buffers with the local agent, trigger syncs and read
// status from the coordinator. Errors come back as absl::Status with the server's code.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "grpcpp/grpcpp.h"
#include "proto/shardsync.grpc.pb.h"

namespace shardsync::client {

// A registration the agent holds while this object lives. Destroying it (or the process
// exiting) ends the call, and the agent drops the buffers and layouts.
class Registration {
 public:
  ~Registration();
  int32_t rank() const { return event_.rank(); }
  // The coordinator's layout epoch once it took the layouts; -1 if not yet.
  int64_t layout_epoch() const { return event_.layout_epoch(); }

 private:
  friend class AgentClient;
  Registration() = default;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::RegisterEvent>> reader_;
  v1::RegisterEvent event_;
  std::thread holder_;
};

class AgentClient {
 public:
  // `socket` is the agent's unix socket path.
  explicit AgentClient(const std::string& socket);
  // Returns once the agent opened and checked everything (or refused it).
  // `descriptors`: host memory passed as file descriptors (a memfd), by buffer name:
  // each is put on the agent's descriptor socket and its buffer's handle names the
  // token (the descriptors stay the caller's). A name no buffer has is refused.
  absl::StatusOr<std::unique_ptr<Registration>> Register(const v1::RegisterRequest& request, absl::Duration timeout,
                                                         const std::map<std::string, int>& descriptors = {});
  absl::StatusOr<v1::AgentStatus> Status(absl::Duration timeout);

 private:
  const std::string socket_;
  std::unique_ptr<v1::Agent::Stub> stub_;
};

class CoordinatorClient {
 public:
  // `credentials`: the TLS ones of common/tls.h, or plaintext for a coordinator run
  // with --insecure.
  CoordinatorClient(const std::string& address, const Credentials& credentials);
  // Waits for the whole sync; `timeout` bounds the wait and is passed on as the sync's.
  // With `verify`, every target placement's checksum is compared with its sources'.
  // With `target_ranks`, only the targets on those ranks are written (partial targets).
  // The wait polls before it sleeps (common/polling.h) unless the last sync's agents
  // copied on their host's cores (SyncResponse.host_copies).
  absl::StatusOr<v1::SyncResponse> Sync(absl::Duration timeout, bool verify = false,
                                        const std::vector<int32_t>& target_ranks = {});
  // The same for a whole request (SyncRequest.links, ...); its timeout_ms is `timeout`.
  absl::StatusOr<v1::SyncResponse> Sync(v1::SyncRequest request, absl::Duration timeout);
  // The plan's bytes and floor (the request's speeds; 0: the coordinator's cost model).
  absl::StatusOr<v1::ExplainResponse> Explain(const v1::ExplainRequest& request, absl::Duration timeout);
  absl::StatusOr<v1::CoordinatorStatus> Status(absl::Duration timeout);

 private:
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::atomic<bool> host_copies_{false};  // the last successful sync's SyncResponse.host_copies
};

// A POSIX shared memory object this process creates and owns (CPU mode): mapped
// read-write, unlinked when destroyed.
class SharedMemory {
 public:
  static absl::StatusOr<std::unique_ptr<SharedMemory>> Create(const std::string& name, int64_t bytes);
  ~SharedMemory();
  uint8_t* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  SharedMemory(std::string name, uint8_t* data, int64_t bytes) : name_(std::move(name)), data_(data), bytes_(bytes) {}
  std::string name_;
  uint8_t* data_;
  int64_t bytes_;
};

}  // namespace shardsync::client
