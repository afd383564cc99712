// A synthetic trainer or rollout client for local runs and end-to-end tests. Creates a
// shared-memory buffer for each of its rank's buffers in a layout spec, fills sources
// with the values of a seed (targets with poison), registers them and holds them.
// Then answers lines on stdin: "refill SEED [CHANGED]" rewrites the sources (only the
// CHANGED fraction of elements, the rest as the first seed left them), "address" prints
// where the first buffer is mapped, "reregister" registers again (after its agent
// restarted), "scribble" keeps writing 0xA5 over the first 8 bytes of its first tensor
// until "still" (a client that writes while a sync runs, for sync --verify), "exit" (or
// end of input) leaves.
// Prints "ready rank=R epoch=E" once registered, or "refused MESSAGE" and exits 3.
#include <atomic>
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "client/cpp/client.h"
#include "common/flags.h"
#include "spec/layout_spec.h"
#include "tools/localsync/contents.h"

int main(int argc, char** argv) {
  using namespace shardsync;
  std::string socket, spec_path, role = "source", prefix = "/shardsync-demo", client_id = "client", drop;
  int32_t rank = 0;
  uint64_t seed = 1;
  CLI::App app("A trainer or rollout client of the local cluster: registers one rank's side of a layout spec.",
               "demo_client");
  app.add_option("--socket", socket, "the agent's unix socket")->required();
  app.add_option("--spec", spec_path, "the layout spec")->required();
  flags::AddInt(app, "--rank", rank, "the rank whose side is registered", 0)->required();
  app.add_option("--role", role, "source or target")->check(CLI::IsMember({"source", "target"}))->capture_default_str();
  flags::AddInt<uint64_t>(app, "--seed", seed, "seed of the source values", 0);
  app.add_option("--shm-prefix", prefix, "prefix of the shared memory objects")->capture_default_str();
  app.add_option("--client-id", client_id, "the registration's client id")->capture_default_str();
  app.add_option("--drop-tensor", drop, "leave this tensor out of the registration");
  if (const int code = flags::Parse(app, argc, argv); code >= 0) return code;
  const bool sources = role == "source";
  auto spec = spec::ReadLayoutSpecFile(spec_path);
  spec::BufferIds ids;
  auto input = spec.ok() ? spec::ToPlanInput(*spec, ids) : spec.status();
  if (!input.ok()) {
    std::cerr << "demo_client: " << input.status().message() << "\n";
    return 2;
  }
  const spec::RankSide side = spec::RankLayouts(*input, ids, rank, sources);

  v1::RegisterRequest request;
  request.set_client_id(client_id);
  request.set_role(sources ? v1::SOURCE : v1::TARGET);
  std::map<planner::Holder, std::unique_ptr<client::SharedMemory>> memory;
  for (const v1::BufferInfo& b : side.buffers) {
    const planner::Holder holder{rank, ids.Id(b.name())};
    const std::string name = prefix + "-r" + std::to_string(rank) + "-" + b.name();
    auto shm = client::SharedMemory::Create(name, b.bytes());
    if (!shm.ok()) {
      std::cerr << "demo_client: " << shm.status().message() << "\n";
      return 1;
    }
    if (!sources) {
      const std::vector<uint8_t> poison = localsync::PoisonedBuffer(b.bytes(), holder, seed);
      std::memcpy((*shm)->data(), poison.data(), poison.size());
    }
    v1::RegisteredBuffer* registered = request.add_buffers();
    registered->set_name(b.name());
    registered->set_bytes(b.bytes());
    registered->mutable_handle()->set_shm_name(name);
    registered->mutable_handle()->set_device(-1);
    memory[holder] = *std::move(shm);
  }
  for (const v1::TensorLayout& t : side.tensors) {
    if (t.name() != drop) *request.add_tensors() = t;
  }
  const auto memory_of = [&](planner::Holder holder) { return memory.at(holder)->data(); };
  if (sources) localsync::WriteSources(*input, localsync::SourceStep{seed, seed}, rank, memory_of);

  client::AgentClient agent(socket);
  auto registration = agent.Register(request, absl::Seconds(10));
  if (!registration.ok()) {
    std::cout << "refused " << registration.status().message() << std::endl;
    return 3;
  }
  std::cout << "ready rank=" << (*registration)->rank() << " epoch=" << (*registration)->layout_epoch() << std::endl;
  std::atomic<bool> scribbling{false};
  std::thread scribbler;
  const auto still = [&] {
    scribbling = false;
    if (scribbler.joinable()) scribbler.join();
  };
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.rfind("refill ", 0) == 0) {
      // "refill SEED [CHANGED]": the first seed's values but for the CHANGED fraction.
      std::istringstream words(line.substr(7));
      localsync::SourceStep step{seed, 0, 1.0};
      double changed = 1.0;
      words >> step.seed;
      if (words >> changed) step.changed = changed;
      localsync::WriteSources(*input, step, rank, memory_of);
      std::cout << "refilled" << std::endl;
    } else if (line == "reregister") {
      registration->reset();
      registration = agent.Register(request, absl::Seconds(10));
      if (!registration.ok()) {
        std::cout << "refused " << registration.status().message() << std::endl;
        return 3;
      }
      std::cout << "ready rank=" << (*registration)->rank() << std::endl;
    } else if (line == "address") {
      std::cout << "address " << static_cast<const void*>(memory.begin()->second->data()) << std::endl;
    } else if (line == "scribble" && !side.tensors.empty() && !scribbler.joinable()) {
      const v1::Placement& first = side.tensors[0].placements(0);
      volatile uint8_t* at = memory_of({rank, ids.Id(first.buffer())}) +
                             first.base() * planner::ElementBytes(spec::ToDType(side.tensors[0].dtype()).value());
      scribbling = true;
      scribbler = std::thread([&scribbling, at] {
        while (scribbling) {
          for (int i = 0; i < 8; ++i) at[i] = 0xA5;
        }
      });
      std::cout << "scribbling" << std::endl;
    } else if (line == "still") {
      still();
      std::cout << "still" << std::endl;
    } else if (line == "exit") {
      break;
    }
  }
  still();
  return 0;
}
