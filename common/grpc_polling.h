// A unary gRPC call's wait for its answer, polled as common/polling.h says: for the
// clients, where no other thread polls gRPC, so polling the queue reads the answer off
// the socket itself (in a daemon, a server thread would, and would be woken for it).
// Header only, with no library behind it: the Python client's shared library links the
// system's gRPC, the C++ client the build's.
#pragma once

#include "common/polling.h"
#include "grpc/support/time.h"
#include "grpcpp/completion_queue.h"

namespace shardsync {

// Waits for the one event of `queue`, the Finish of the unary call it was made for,
// polling the queue before it sleeps on it; then shuts the queue down and drains it.
// The calling thread must be the queue's only reader.
inline void AwaitUnaryFinish(grpc::CompletionQueue& queue) {
  void* tag = nullptr;
  bool ok = false;
  const bool polled = PollFor(
      [&] { return queue.AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC)) != grpc::CompletionQueue::TIMEOUT; });
  if (!polled) queue.Next(&tag, &ok);
  queue.Shutdown();
  while (queue.Next(&tag, &ok)) {
  }
}

}  // namespace shardsync
