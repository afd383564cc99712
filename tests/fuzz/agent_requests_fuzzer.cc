// Fuzz target: any sequence of the requests local clients and the coordinator send one
// agent (register, withdraw, Prepare, Execute, Abort, Transfer, status), each any bytes
// (tests/fuzz/agent_requests.h). The agent runs on host memory with a loopback
// transport to no other rank; registered buffers are heap memory of exactly their size,
// so a write past one is a sanitizer finding. Its handlers must refuse what is out of
// bounds and never fault, whatever came before; what it reports must be its own rank.
// Deadlines are cut to a few milliseconds so an input cannot stall the fuzzer.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "daemon/agent/agent.h"
#include "executor/device.h"
#include "executor/mailbox.h"
#include "spdlog/spdlog.h"
#include "tests/agent/heap_backend.h"
#include "tests/agent/one_tensor.h"
#include "tests/fuzz/agent_requests.h"

namespace {

using namespace shardsync;

[[noreturn]] void Finding(const char* what) {
  std::fprintf(stderr, "FINDING: the agent %s\n", what);
  std::abort();
}

void CutDeadline(v1::PrepareRequest& request) {
  if (request.deadline_ms() > 5) request.set_deadline_ms(5);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = (spdlog::set_level(spdlog::level::off), true);
  (void)quiet;
  if (size < 1) return 0;
  const int32_t world = 1 + data[0] % 4;
  const int32_t rank = (data[0] >> 2) % world;
  agent::HeapBackend backend(int64_t{1} << 20);
  agent::Registry registry(rank, {&backend}, agent::RegistryLimits{8, 4});
  agent::CoordinatorLink link(agent::UnusedLink(), registry);  // never started
  executor::HostDevice device;
  executor::Mailbox mailbox;
  executor::LoopbackTransport transport(rank, {{rank, &mailbox}});
  agent::AgentConfig config;
  config.rank = rank;
  config.max_staging_bytes = int64_t{1} << 20;
  agent::Agent agent(config, registry, link, device, transport, mailbox);
  const agent::Peer self{static_cast<int32_t>(getpid()), geteuid()};
  for (size_t at = 1; at + 3 <= size;) {
    const uint8_t op = data[at];
    const size_t length = std::min<size_t>(data[at + 1] | (data[at + 2] << 8), size - at - 3);
    const uint8_t* bytes = data + at + 3;
    at += 3 + length;
    switch (static_cast<fuzz::AgentOp>((op & 0x7f) % fuzz::kAgentOps)) {
      case fuzz::AgentOp::kRegister: {
        v1::RegisterRequest request;
        if (!request.ParseFromArray(bytes, static_cast<int>(length))) break;
        agent::Peer peer = self;
        if (op & 0x80) peer.uid += 1;
        const absl::Status admitted = agent.Admit(request, peer);
        if (admitted.ok() && peer.uid != self.uid) Finding("took a registration from a uid it was not given");
        break;
      }
      case fuzz::AgentOp::kWithdraw:
        agent.Withdraw(std::string(reinterpret_cast<const char*>(bytes), length));
        break;
      case fuzz::AgentOp::kPrepare: {
        v1::PrepareRequest request;
        if (!request.ParseFromArray(bytes, static_cast<int>(length))) break;
        CutDeadline(request);
        const v1::PrepareResponse response = agent.Prepare(request);
        if (response.ok() && request.world_size() <= rank) Finding("prepared a sync in a world without its rank");
        break;
      }
      case fuzz::AgentOp::kExecute: {
        v1::ExecuteRequest request;
        if (!request.ParseFromArray(bytes, static_cast<int>(length))) break;
        if (request.has_prepare()) CutDeadline(*request.mutable_prepare());
        const absl::StatusOr<v1::ExecuteResponse> response = agent.Execute(request);
        if (response.ok() && response->stats().rank() != rank) Finding("reported another rank's sync");
        break;
      }
      case fuzz::AgentOp::kAbort: {
        v1::AbortRequest request;
        if (!request.ParseFromArray(bytes, static_cast<int>(length))) break;
        agent.Abort(request);
        break;
      }
      case fuzz::AgentOp::kTransfer: {
        v1::TransferRequest request;
        if (!request.ParseFromArray(bytes, static_cast<int>(length))) break;
        (void)agent.Transfer(request, absl::Now() + absl::Milliseconds(2));
        break;
      }
      case fuzz::AgentOp::kReport:
        if (agent.Status().rank() != rank || agent.Progress().rank() != rank) Finding("reported another rank");
        (void)agent.Metrics();
        break;
    }
  }
  return 0;
}
