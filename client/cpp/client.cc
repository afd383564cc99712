#include "client/cpp/client.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <future>

#include "absl/strings/str_cat.h"
#include "common/client_messages.h"
#include "common/descriptor_passing.h"
#include "common/grpc_polling.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"

namespace shardsync::client {
namespace {

std::shared_ptr<grpc::Channel> Channel(const std::string& target, const Credentials& credentials) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kClientMessageBytes);
  args.SetMaxSendMessageSize(kClientMessageBytes);
  return MakeChannel(target, credentials, args);
}

// The agent's unix socket: its file mode decides who may connect; no TLS on it.
Credentials UnixSocketCredentials() {
  TlsConfig plaintext;
  plaintext.insecure = true;
  return *LoadCredentials(plaintext);  // never fails for plaintext
}

// `prepare_async(context, request, queue)`: the stub's PrepareAsync call. The calling
// thread waits for the answer on a queue of its own, polling it for `poll_for` first.
template <typename Request, typename Response, typename PrepareAsync>
absl::StatusOr<Response> Unary(PrepareAsync prepare_async, const Request& request, absl::Duration timeout,
                               std::chrono::steady_clock::duration poll_for = kPollBeforeSleep) {
  Response response;
  const grpc::Status status = UnaryCall(
      absl::ToChronoTime(absl::Now() + timeout),
      [&](grpc::ClientContext* context, grpc::CompletionQueue* queue) {
        return prepare_async(context, request, queue);
      },
      &response, poll_for);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

}  // namespace

Registration::~Registration() {
  context_.TryCancel();
  if (holder_.joinable()) holder_.join();
}

AgentClient::AgentClient(const std::string& socket)
    : socket_(socket), stub_(v1::Agent::NewStub(Channel("unix:" + socket, UnixSocketCredentials()))) {}

absl::StatusOr<std::unique_ptr<Registration>> AgentClient::Register(const v1::RegisterRequest& request,
                                                                    absl::Duration timeout,
                                                                    const std::map<std::string, int>& descriptors) {
  const absl::Time deadline = absl::Now() + timeout;
  // The descriptors wait on the agent for this registration while `passing` is open.
  v1::RegisterRequest passed = request;
  UniqueFd passing;
  size_t named = 0;
  for (v1::RegisteredBuffer& buffer : *passed.mutable_buffers()) {
    const auto fd = descriptors.find(buffer.name());
    if (fd == descriptors.end()) continue;
    ++named;
    if (!passing.valid()) {
      SHARDSYNC_ASSIGN_OR_RETURN(passing, ConnectDescriptorSocket(DescriptorSocketPath(socket_)));
    }
    SHARDSYNC_ASSIGN_OR_RETURN(std::string token, PutDescriptors(passing.get(), {fd->second}, deadline));
    buffer.mutable_handle()->set_descriptor_token(token);
  }
  if (named != descriptors.size()) {
    return absl::InvalidArgumentError(absl::StrCat("client '", request.client_id(), "': ", descriptors.size() - named,
                                                   " descriptors are given for buffers the request does not have"));
  }
  std::unique_ptr<Registration> registration(new Registration());
  Registration* r = registration.get();
  r->reader_ = stub_->Register(&r->context_, passed);
  // The first event says the agent holds everything; then the call stays open in the
  // holder thread until the registration is destroyed.
  std::promise<absl::Status> first;
  std::future<absl::Status> answered = first.get_future();
  r->holder_ = std::thread([r, &first] {
    if (r->reader_->Read(&r->event_)) {
      first.set_value(absl::OkStatus());
      v1::RegisterEvent ignored;
      while (r->reader_->Read(&ignored)) {
      }
      r->reader_->Finish().ok();
      return;
    }
    first.set_value(FromGrpcStatus(r->reader_->Finish()));
  });
  if (answered.wait_until(absl::ToChronoTime(deadline)) != std::future_status::ready) {
    r->context_.TryCancel();
    answered.wait();
    return absl::DeadlineExceededError("the agent did not answer the registration in time");
  }
  SHARDSYNC_RETURN_IF_ERROR(answered.get());
  return registration;
}

absl::StatusOr<v1::AgentStatus> AgentClient::Status(absl::Duration timeout) {
  return Unary<v1::AgentStatusRequest, v1::AgentStatus>(
      [&](auto* c, const auto& q, auto* cq) { return stub_->PrepareAsyncStatus(c, q, cq); }, v1::AgentStatusRequest(),
      timeout);
}

CoordinatorClient::CoordinatorClient(const std::string& address, const Credentials& credentials)
    : stub_(v1::Coordinator::NewStub(Channel(address, credentials))) {}

absl::StatusOr<v1::SyncResponse> CoordinatorClient::Sync(absl::Duration timeout, bool verify,
                                                         const std::vector<int32_t>& target_ranks) {
  v1::SyncRequest request;
  request.set_verify(verify);
  request.mutable_target_ranks()->Add(target_ranks.begin(), target_ranks.end());
  return Sync(std::move(request), timeout);
}

absl::StatusOr<v1::SyncResponse> CoordinatorClient::Sync(v1::SyncRequest request, absl::Duration timeout) {
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  // The coordinator needs a little longer than the sync's own deadline to report it.
  absl::StatusOr<v1::SyncResponse> response = Unary<v1::SyncRequest, v1::SyncResponse>(
      [&](auto* c, const auto& q, auto* cq) { return stub_->PrepareAsyncSync(c, q, cq); }, request,
      timeout + absl::Seconds(10), SyncWaitPoll(host_copies_));
  if (response.ok()) host_copies_ = response->host_copies();
  return response;
}

absl::StatusOr<v1::ExplainResponse> CoordinatorClient::Explain(const v1::ExplainRequest& request,
                                                               absl::Duration timeout) {
  return Unary<v1::ExplainRequest, v1::ExplainResponse>(
      [&](auto* c, const auto& q, auto* cq) { return stub_->PrepareAsyncExplain(c, q, cq); }, request, timeout);
}

absl::StatusOr<v1::CoordinatorStatus> CoordinatorClient::Status(absl::Duration timeout) {
  return Unary<v1::CoordinatorStatusRequest, v1::CoordinatorStatus>(
      [&](auto* c, const auto& q, auto* cq) { return stub_->PrepareAsyncStatus(c, q, cq); },
      v1::CoordinatorStatusRequest(), timeout);
}

absl::StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::Create(const std::string& name, int64_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("shm_open('", name, "'): ", std::strerror(errno)));
  const size_t size = static_cast<size_t>(std::max<int64_t>(bytes, 1));
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const int error = errno;
    close(fd);
    shm_unlink(name.c_str());
    return absl::InternalError(absl::StrCat("ftruncate('", name, "'): ", std::strerror(error)));
  }
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  if (data == MAP_FAILED) {
    shm_unlink(name.c_str());
    return absl::InternalError(absl::StrCat("mmap('", name, "'): ", std::strerror(error)));
  }
  return std::unique_ptr<SharedMemory>(new SharedMemory(name, static_cast<uint8_t*>(data), bytes));
}

SharedMemory::~SharedMemory() {
  munmap(data_, static_cast<size_t>(std::max<int64_t>(bytes_, 1)));
  shm_unlink(name_.c_str());
}

}  // namespace shardsync::client
