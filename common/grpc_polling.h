// A unary gRPC call's wait for its answer, polled as common/polling.h says. Where no
// other thread of the process waits in gRPC (the Python client's native call), polling
// the queue reads the answer off the socket itself. Where one does (a daemon's server
// threads, the C++ client's thread holding a registration open), that thread reads it
// and is woken for it; the caller, polling, is spared the second wake-up, the hand-off.
// Header only, with no library behind it: the Python client's shared library links the
// system's gRPC, the daemons and the C++ client the build's.
#pragma once

#include <chrono>
#include <memory>
#include <utility>

#include "common/polling.h"
#include "grpc/support/time.h"
#include "grpcpp/client_context.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/support/async_unary_call.h"
#include "grpcpp/support/status.h"

namespace shardsync {

// Waits for the one event of `queue`, the Finish of the unary call it was made for,
// polling the queue for `poll_for` before it sleeps on it; then shuts the queue down and
// drains it. The calling thread must be the queue's only reader.
inline void AwaitUnaryFinish(grpc::CompletionQueue& queue,
                             std::chrono::steady_clock::duration poll_for = kPollBeforeSleep) {
  void* tag = nullptr;
  bool ok = false;
  const bool polled = PollFor(
      [&] { return queue.AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC)) != grpc::CompletionQueue::TIMEOUT; },
      poll_for);
  if (!polled) queue.Next(&tag, &ok);
  queue.Shutdown();
  while (queue.Next(&tag, &ok)) {
  }
}

// One unary call, sent when it is made and awaited later, by this thread or another.
// `prepare_async(context, queue)` is the stub's PrepareAsync call with its request bound
// (serialized here, so the caller need not keep it). Await once; a call destroyed
// unawaited is cancelled and drained.
template <typename Response>
class StartedUnaryCall {
 public:
  template <typename PrepareAsync>
  StartedUnaryCall(std::chrono::system_clock::time_point deadline, PrepareAsync prepare_async) {
    context_.set_deadline(deadline);
    reader_ = prepare_async(&context_, &queue_);
    reader_->StartCall();
    reader_->Finish(&response_, &status_, &status_);
  }
  ~StartedUnaryCall() {
    if (awaited_) return;
    context_.TryCancel();
    AwaitUnaryFinish(queue_, std::chrono::steady_clock::duration::zero());
  }
  StartedUnaryCall(const StartedUnaryCall&) = delete;
  StartedUnaryCall& operator=(const StartedUnaryCall&) = delete;

  // Waits for the answer as AwaitUnaryFinish does; the call's status, and the answer in
  // `response`.
  grpc::Status Await(Response* response, std::chrono::steady_clock::duration poll_for = kPollBeforeSleep) {
    AwaitUnaryFinish(queue_, poll_for);
    awaited_ = true;
    *response = std::move(response_);
    return status_;
  }

 private:
  grpc::ClientContext context_;
  grpc::CompletionQueue queue_;
  grpc::Status status_;
  Response response_;
  std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> reader_;
  bool awaited_ = false;
};

// Makes one unary call and waits for its answer, as StartedUnaryCall's Await does.
template <typename Response, typename PrepareAsync>
grpc::Status UnaryCall(std::chrono::system_clock::time_point deadline, PrepareAsync prepare_async, Response* response,
                       std::chrono::steady_clock::duration poll_for = kPollBeforeSleep) {
  return StartedUnaryCall<Response>(deadline, prepare_async).Await(response, poll_for);
}

}  // namespace shardsync
