// A unary gRPC call's wait for its answer, polled as common/polling.h says. Where no
// other thread of the process waits in gRPC (the Python client's native call), polling
// the queue reads the answer off the socket itself. Where one does (a daemon's server
// threads, the C++ client's thread holding a registration open), that thread reads it
// and is woken for it; the caller, polling, is spared the second wake-up, the hand-off.
// Header only, with no library behind it: the Python client's shared library links the
// system's gRPC, the daemons and the C++ client the build's.
#pragma once

#include <chrono>

#include "common/polling.h"
#include "grpc/support/time.h"
#include "grpcpp/completion_queue.h"
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

// Makes one unary call and waits for its answer into `response`, as AwaitUnaryFinish
// does; the call's status. `prepare_async(queue)` is the stub's PrepareAsync call, its
// context and request bound by the caller, who keeps them until this returns.
template <typename Response, typename PrepareAsync>
grpc::Status UnaryCall(PrepareAsync prepare_async, Response* response,
                       std::chrono::steady_clock::duration poll_for = kPollBeforeSleep) {
  grpc::CompletionQueue queue;
  grpc::Status status;
  auto call = prepare_async(&queue);
  call->StartCall();
  call->Finish(response, &status, &status);
  AwaitUnaryFinish(queue, poll_for);
  return status;
}

}  // namespace shardsync
