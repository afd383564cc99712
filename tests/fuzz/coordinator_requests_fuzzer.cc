// Fuzz target: any sequence of the requests agents and clients send the coordinator
// (Join, Publish, Explain, Status), each any bytes, into one coordinator. Its handlers
// must refuse what is out of bounds and never fault (sanitizers), whatever came before;
// what they report must stay within the world.
//
// Input: a world byte (1..8 agents), then records of one op byte (Join, Publish,
// Explain, Status by its value mod 4), a 2-byte little-endian length and that many
// bytes of the request. Nothing reaches the network: every agent address becomes
// 127.0.0.1:1, and none of these calls contacts an agent.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "common/contract_id.h"
#include "common/tls.h"
#include "daemon/coordinator/coordinator.h"

namespace {

[[noreturn]] void Finding(const char* what) {
  std::fprintf(stderr, "FINDING: the coordinator %s\n", what);
  std::abort();
}

const shardsync::Credentials& Plaintext() {
  static const shardsync::Credentials credentials = [] {
    shardsync::TlsConfig config;
    config.insecure = true;
    return *shardsync::LoadCredentials(config);
  }();
  return credentials;
}

// A channel alive between inputs keeps gRPC's shared event engine alive, so that the
// agents' channels of an input do not create it anew and free it after the input:
// libFuzzer runs its whole-heap leak check after each input whose allocations do not
// balance.
void KeepGrpcEngine() {
  static const std::shared_ptr<grpc::Channel> channel = shardsync::MakeChannel("127.0.0.1:1", Plaintext(), {});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardsync;
  KeepGrpcEngine();
  if (size < 1) return 0;
  coordinator::CoordinatorConfig config;
  config.world_size = 1 + data[0] % 8;
  config.credentials = Plaintext();
  config.rpc_deadline = absl::Milliseconds(10);
  coordinator::Coordinator coordinator(config);
  for (size_t at = 1; at + 3 <= size;) {
    const uint8_t op = data[at] % 4;
    const size_t length = std::min<size_t>(data[at + 1] | (data[at + 2] << 8), size - at - 3);
    const uint8_t* bytes = data + at + 3;
    at += 3 + length;
    if (op == 0) {
      v1::JoinRequest join;
      if (!join.ParseFromArray(bytes, static_cast<int>(length))) continue;
      if (!join.address().empty()) join.set_address("127.0.0.1:1");
      // A contract of one byte stands for another build's agent; any other, this build's.
      if (join.contract().size() != 1) join.set_contract(kContractId);
      const auto joined = coordinator.Join(join);
      if (joined.ok() && (join.rank() < 0 || join.rank() >= config.world_size))
        Finding("took a rank outside the world");
      if (joined.ok() && join.contract() != kContractId) Finding("took an agent of another build");
    } else if (op == 1) {
      v1::PublishRequest publish;
      if (!publish.ParseFromArray(bytes, static_cast<int>(length))) continue;
      const auto published = coordinator.Publish(publish);
      if (published.ok() && (publish.rank() < 0 || publish.rank() >= config.world_size)) {
        Finding("took a publication from a rank outside the world");
      }
    } else if (op == 2) {
      v1::ExplainRequest explain;
      if (!explain.ParseFromArray(bytes, static_cast<int>(length))) continue;
      const auto explained = coordinator.Explain(explain);
      if (explained.ok() && explained->ranks_size() > config.world_size) Finding("explained more ranks than the world");
    } else {
      const v1::CoordinatorStatus status = coordinator.Status();
      for (const v1::AgentInfo& agent : status.agents()) {
        if (agent.rank() < 0 || agent.rank() >= config.world_size) Finding("reported an agent outside the world");
      }
    }
  }
  return 0;
}
