// Waits that poll before they sleep (common/polling.h, common/grpc_polling.h): they end
// as soon as what they wait for is there, whether it came while they polled or after.
#include "common/polling.h"

#include <catch2/catch.hpp>
#include <chrono>

#include "common/grpc_polling.h"
#include "grpcpp/alarm.h"
#include "tests/common/thread_cpu.h"

namespace shardsync {
namespace {

using Clock = std::chrono::steady_clock;

TEST_CASE("PollFor returns true at the first look that finds it ready") {
  int looks = 0;
  CHECK(PollFor([&] { return ++looks == 5; }));
  CHECK(looks == 5);
}

TEST_CASE("PollFor gives up after its limit") {
  const auto start = Clock::now();
  int looks = 0;
  CHECK_FALSE(PollFor([&] { return ++looks < 0; }, std::chrono::milliseconds(20)));
  CHECK(Clock::now() - start >= std::chrono::milliseconds(20));
  CHECK(looks > 1);
}

// An alarm stands in for a call's Finish: the queue's one event.
TEST_CASE("AwaitUnaryFinish takes its queue's event, polled or slept for, and drains the queue") {
  const auto after = GENERATE(std::chrono::milliseconds(5), kPollBeforeSleep * 3);
  grpc::CompletionQueue queue;
  grpc::Alarm alarm;
  const auto start = Clock::now();
  alarm.Set(&queue, std::chrono::system_clock::now() + after, &alarm);
  AwaitUnaryFinish(queue);
  CHECK(Clock::now() - start >= after);
  void* tag = nullptr;
  bool ok = false;
  CHECK_FALSE(queue.Next(&tag, &ok));  // shut down and empty
}

TEST_CASE("AwaitUnaryFinish without polling sleeps: the wait spends almost none of a core") {
  grpc::CompletionQueue queue;
  grpc::Alarm alarm;
  const auto wait = std::chrono::milliseconds(300);
  const auto start = Clock::now();
  const auto cpu_before = testing::ThreadCpu();
  alarm.Set(&queue, std::chrono::system_clock::now() + wait, &alarm);
  AwaitUnaryFinish(queue, Clock::duration::zero());
  CHECK(Clock::now() - start >= wait);
  // Polling would look for all of its 50 ms; a sleep costs microseconds.
  CHECK(testing::ThreadCpu() - cpu_before < kPollBeforeSleep / 5);
}

}  // namespace
}  // namespace shardsync
