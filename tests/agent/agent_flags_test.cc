// shardsync-agent's flags: one of --coordinator and a true --serve-coordinator, the
// coordinator's flags only with the latter, --device cpu or an ordinal 0..1023.
#include "daemon/agent/agent_flags.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace shardsync::agent {
namespace {

struct Parsed {
  AgentFlags flags;
  CLI::App app{"test", "shardsync-agent"};
  int code = 0;  // -1 parsed, 2 a usage error
  std::string error;
  explicit Parsed(std::vector<std::string> args) {
    AddAgentFlags(app, flags);
    args.insert(args.begin(), {"shardsync-agent", "--rank", "0", "--socket", "/tmp/a.sock"});
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    code = flags::Parse(app, static_cast<int>(argv.size()), argv.data());
    if (code == -1) {
      error = FinishAgentFlags(app, flags);
      if (!error.empty()) code = 2;
    }
  }
};

TEST_CASE("an agent joins a coordinator or serves one, never neither or both") {
  CHECK(Parsed({"--coordinator", "127.0.0.1:7070"}).code == -1);
  CHECK(Parsed({"--serve-coordinator", "--world", "2"}).code == -1);
  CHECK(Parsed({"--serve-coordinator=false", "--coordinator", "h:1"}).code == -1);
  CHECK(Parsed({}).code == 2);
  CHECK(Parsed({"--serve-coordinator=false"}).code == 2);
  CHECK(Parsed({"--serve-coordinator", "--world", "2", "--coordinator", "h:1"}).code == 2);
  CHECK(Parsed({"--serve-coordinator"}).code == 2);  // no --world
  CHECK(Parsed({"--serve-coordinator", "--world", "1", "--rank", "3"}).code == 2);
}

TEST_CASE("the coordinator's flags go with a true --serve-coordinator only") {
  for (const std::vector<std::string>& extra : std::vector<std::vector<std::string>>{
           {"--world", "3"}, {"--staging-bytes", "65536"}, {"--relay", "never"}, {"--link-gbps", "100"}}) {
    INFO(extra[0]);
    CHECK(Parsed({"--coordinator", "h:1", extra[0], extra[1]}).code == 2);
    std::vector<std::string> off = {"--serve-coordinator=false", "--coordinator", "h:1"};
    off.insert(off.end(), extra.begin(), extra.end());
    CHECK(Parsed(off).code == 2);
  }
}

TEST_CASE("--max-tensors bounds the agent's registrations and, served here, the coordinator's publications") {
  const Parsed joined({"--coordinator", "h:1", "--max-tensors", "5"});
  REQUIRE(joined.code == -1);
  CHECK(joined.flags.registrations.tensors == 5);
  const Parsed serving({"--serve-coordinator", "--world", "2", "--max-tensors", "7"});
  REQUIRE(serving.code == -1);
  CHECK(serving.flags.registrations.tensors == 7);
  CHECK(serving.flags.coordinator_config.max_tensors == 7);
  CHECK(Parsed({"--coordinator", "h:1"}).flags.registrations.tensors == kDefaultMaxTensors);
  CHECK(Parsed({"--coordinator", "h:1", "--max-tensors", "0"}).code == 2);
}

TEST_CASE("--device is cpu or a CUDA ordinal 0..1023, named as such") {
  Parsed gpu({"--coordinator", "h:1", "--device", "3"});
  REQUIRE(gpu.code == -1);
  CHECK(gpu.flags.ordinal == 3);
  CHECK(gpu.flags.agent.device == "cuda:3");
  Parsed cpu({"--coordinator", "h:1"});
  REQUIRE(cpu.code == -1);
  CHECK(cpu.flags.ordinal == -1);
  CHECK(cpu.flags.agent.device == "cpu");
  for (const char* bad : {"99999999999", "-1", "00", "-0", "1024", "gpu", "0x1"}) {
    INFO(bad);
    CHECK(Parsed({"--coordinator", "h:1", "--device", bad}).code == 2);
  }
}

}  // namespace
}  // namespace shardsync::agent
