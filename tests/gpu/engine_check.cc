// The round engine's double-buffered rounds on one GPU, with every element checked
// (tests/planner/sync_check.h) over random layouts and budgets. Two ways to have rounds
// on one GPU (tests/gpu/check_transports.h):
//   --transport copy       every rank a thread with its own CudaDevice, ranks joined by
//                          peer copies ordered as an NCCL group orders them;
//   --transport nccl-self  the agent's own NcclTransport: every rank's buffers and
//                          streams as one rank's, each stream sent to itself over a
//                          one-rank communicator.
// --slow-link-us holds every transfer, so packs run far ahead of the link;
// --slow-unpack-us holds every unpack, so transfers run ahead of the unpacks: a staging
// slot reused too early either way shows as a wrong element.
//   engine_check [--seeds N] [--transport copy|nccl-self] [--slow-link-us U] [--slow-unpack-us U]
// prints one JSON line, exits 1 on a mismatch.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/status_macros.h"
#include "executor/cuda_device.h"
#include "executor/nccl_transport.h"
#include "executor/round_engine.h"
#include "planner/model_layout.h"
#include "planner/schedule.h"
#include "tests/gpu/check_transports.h"
#include "tests/planner/random_layouts.h"
#include "tests/planner/sync_check.h"

namespace shardsync::executor {
namespace {

struct Options {
  bool nccl_self = false;
  int64_t link_us = 0;
  int64_t unpack_us = 0;
};

// The agent's device and NCCL transport of one rank alone, built once for every layout.
struct SelfRank {
  std::unique_ptr<CudaDevice> device;
  std::unique_ptr<NcclTransport> nccl;
};

absl::StatusOr<SelfRank> OpenSelfRank() {
  SelfRank rank;
  SHARDSYNC_ASSIGN_OR_RETURN(rank.device, CudaDevice::Open(0));
  rank.nccl = std::make_unique<NcclTransport>(0, rank.device->network_stream());
  SHARDSYNC_ASSIGN_OR_RETURN(auto id, rank.nccl->NewCommunicatorId());
  PeerSetup setup;
  setup.world_size = 1;
  setup.communicator_id = id;
  setup.generation = 1;
  SHARDSYNC_RETURN_IF_ERROR(rank.nccl->Setup(setup, absl::Now() + absl::Seconds(60)));
  return rank;
}

// The transport's agreement on its communicator of one rank: each vote comes back as
// cast, 200 times alternating. Returns the first wrong answer or error (empty: none);
// `median_us`: the host's time for one agreement.
std::string CheckAgreement(SelfRank& rank, double* median_us) {
  PeerSetup setup;
  setup.world_size = 1;
  std::vector<double> us;
  for (int i = 0; i < 200; ++i) {
    const bool vote = i % 2 == 0;
    const absl::Time start = absl::Now();
    const absl::StatusOr<bool> all = rank.nccl->Agree("agreement-check", setup, vote, absl::Now() + absl::Seconds(10));
    us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
    if (!all.ok()) return std::string(all.status().message());
    if (*all != vote) return absl::StrCat("vote ", vote, " came back as ", *all);
  }
  std::sort(us.begin(), us.end());
  *median_us = us[us.size() / 2];
  return "";
}

// Every rank's part of `plan` as one rank's: buffer ids made distinct (rank r's buffer b
// is r * stride + b), local copies and fills together, and each (sender, receiver) pair's
// send and receive streams of a stage as one stream with itself under its own peer id.
struct Merged {
  planner::Plan plan;
  planner::Schedule schedule;
  int32_t stride = 0;
};

Merged MergeRanks(const planner::Plan& plan, const std::vector<planner::Schedule>& schedules) {
  Merged merged{plan, planner::Schedule{}, 0};
  for (const planner::Segment& s : plan.segments) merged.stride = std::max({merged.stride, s.src.buffer, s.dst.buffer});
  for (const planner::FillOp& f : plan.fills) merged.stride = std::max(merged.stride, f.fill.holder.buffer);
  ++merged.stride;
  const auto remap = [&](planner::Holder& h) { h.buffer = h.rank * merged.stride + h.buffer; };
  for (planner::Segment& s : merged.plan.segments) {
    remap(s.src);
    remap(s.dst);
  }
  for (planner::FillOp& f : merged.plan.fills) remap(f.fill.holder);
  int32_t pair = 0;
  merged.schedule.stages.resize(plan.stages);
  for (const planner::Schedule& s : schedules) {
    merged.schedule.fills.insert(merged.schedule.fills.end(), s.fills.begin(), s.fills.end());
    for (size_t k = 0; k < s.stages.size(); ++k) {
      const planner::Stage& stage = s.stages[k];
      planner::Stage& one = merged.schedule.stages[k];
      one.local_segments.insert(one.local_segments.end(), stage.local_segments.begin(), stage.local_segments.end());
      one.rounds = std::max(one.rounds, stage.rounds);
      one.first_round = stage.first_round;
      for (const planner::PeerStream& send : stage.sends) {
        for (const planner::PeerStream& receive : schedules[send.peer].stages[k].receives) {
          if (receive.peer != s.rank) continue;
          one.sends.push_back(send);
          one.receives.push_back(receive);
          one.sends.back().peer = one.receives.back().peer = ++pair;
        }
      }
    }
  }
  return merged;
}

struct Outcome {
  int64_t rounds = 0;
  int64_t staged_peak = 0;
  std::string error;  // empty: every element right
  bool relayed = false;
};

// One random layout: device copies of the host buffers, the rounds, the buffers back,
// every element checked.
Outcome SyncOnce(uint64_t seed, const Options& options, SelfRank* self) {
  std::mt19937_64 rng(seed);
  auto input = planner::ExpandModel(::shardsync::testing::RandomModel(rng));
  if (!input.ok()) return {0, 0, std::string(input.status().message())};
  const int64_t budget = std::vector<int64_t>{16, 64, 256, 4096}[seed % 4];
  // Every other layout over random nodes, relayed: a rank's relay stage must wait for
  // its first stage's receives and unpacks (the device's fence), held back or not.
  const bool relay = seed % 2 == 0;
  if (relay) ::shardsync::testing::PlaceOnRandomNodes(*input, 2, rng);
  auto plan = planner::MakePlan(*input, *planner::LocalFirstLeastLoaded(), planner::PlanOptions{relay});
  if (!plan.ok()) return {0, 0, std::string(plan.status().message())};
  auto schedules = planner::MakeSchedules(*plan, budget);
  if (!schedules.ok()) return {0, 0, std::string(schedules.status().message())};

  ::shardsync::testing::HostBuffers buffers = ::shardsync::testing::AllocateBuffers(*input);
  const ::shardsync::testing::TensorValues values = ::shardsync::testing::PrepareBuffers(*input, rng, buffers);
  const ::shardsync::testing::HostBuffers before = buffers;
  std::map<planner::Holder, uint8_t*> device_buffers;
  for (auto& [holder, bytes] : buffers) {
    uint8_t* memory = nullptr;
    if (cudaMalloc(&memory, std::max<size_t>(bytes.size(), 1)) != cudaSuccess ||
        cudaMemcpy(memory, bytes.data(), bytes.size(), cudaMemcpyHostToDevice) != cudaSuccess) {
      return {0, 0, "cudaMalloc/cudaMemcpy failed"};
    }
    device_buffers[holder] = memory;
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::vector<absl::StatusOr<ExecutionStats>> results;
  if (options.nccl_self) {
    const Merged merged = MergeRanks(*plan, *schedules);
    BufferTable table(static_cast<size_t>(plan->num_ranks) * merged.stride, nullptr);
    for (const auto& [holder, memory] : device_buffers) table[holder.rank * merged.stride + holder.buffer] = memory;
    testing::HeldDevice held(*self->device, options.link_us, options.unpack_us);
    testing::SelfTransport transport(*self->nccl);
    RoundEngine engine(held, transport);
    results.push_back(engine.Run({"check", merged.plan, merged.schedule, table, budget, deadline, nullptr, {}}));
  } else {
    std::vector<BufferTable> tables(plan->num_ranks);
    for (const auto& [holder, memory] : device_buffers) {
      BufferTable& table = tables[holder.rank];
      if (static_cast<int32_t>(table.size()) <= holder.buffer) table.resize(holder.buffer + 1, nullptr);
      table[holder.buffer] = memory;
    }
    testing::Hub hub;
    results.assign(plan->num_ranks, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int32_t r = 0; r < plan->num_ranks; ++r) {
      threads.emplace_back([&, r] {
        auto device = CudaDevice::Open(0);
        if (!device.ok()) {
          results[r] = device.status();
          return;
        }
        testing::CopyTransport transport(r, hub, (*device)->network_stream());
        testing::HeldDevice held(**device, options.link_us, options.unpack_us);
        RoundEngine engine(held, transport);
        results[r] = engine.Run({"check", *plan, (*schedules)[r], tables[r], budget, deadline, nullptr, {}});
      });
    }
    for (std::thread& t : threads) t.join();
  }
  Outcome outcome;
  outcome.relayed = plan->stages > 1;
  for (size_t r = 0; r < results.size(); ++r) {
    if (!results[r].ok()) {
      outcome.error = absl::StrCat("rank ", r, ": ", results[r].status().message());
    } else {
      outcome.rounds = std::max<int64_t>(outcome.rounds, results[r]->rounds);
      outcome.staged_peak = std::max(outcome.staged_peak, results[r]->peak_peer_staging_bytes);
    }
  }
  for (auto& [holder, memory] : device_buffers) {
    std::vector<uint8_t>& bytes = buffers[holder];
    if (cudaMemcpy(bytes.data(), memory, bytes.size(), cudaMemcpyDeviceToHost) != cudaSuccess) {
      outcome.error = "copying a buffer back failed";
    }
    cudaFree(memory);
  }
  if (!outcome.error.empty()) return outcome;
  const std::vector<std::string> errors = ::shardsync::testing::CheckSync(*input, values, before, buffers);
  if (!errors.empty()) outcome.error = errors.front();
  if (outcome.staged_peak > budget)
    outcome.error = absl::StrCat("staging of ", outcome.staged_peak, " > budget ", budget);
  return outcome;
}

}  // namespace
}  // namespace shardsync::executor

int main(int argc, char** argv) {
  using namespace shardsync::executor;
  namespace flags = shardsync::flags;
  int64_t seeds = 200;
  std::string transport = "copy";
  Options options;
  CLI::App app("The round engine on one GPU over random layouts, every byte checked.", "engine_check");
  flags::AddInt<int64_t>(app, "--seeds", seeds, "random layouts", 1);
  app.add_option("--transport", transport, "copy or nccl-self")->check(CLI::IsMember({"copy", "nccl-self"}));
  flags::AddInt<int64_t>(app, "--slow-link-us", options.link_us, "hold each transfer this long", 0);
  flags::AddInt<int64_t>(app, "--slow-unpack-us", options.unpack_us, "hold each unpack this long", 0);
  if (const int code = flags::Parse(app, argc, argv); code >= 0) return code;
  options.nccl_self = transport == "nccl-self";
  SelfRank self;
  if (options.nccl_self) {
    auto opened = OpenSelfRank();
    if (!opened.ok()) {
      std::fprintf(stderr, "engine_check: %s\n", std::string(opened.status().message()).c_str());
      return 1;
    }
    self = *std::move(opened);
  }
  // Only a communicator of one rank here: the votes of several meet on the 2-GPU machine.
  double agree_us = 0;
  const std::string agreement = options.nccl_self ? CheckAgreement(self, &agree_us) : "not run (copy transport)";
  int64_t rounds = 0, failed = 0, relayed = 0;
  std::string first_error;
  for (uint64_t seed = 1; seed <= static_cast<uint64_t>(seeds); ++seed) {
    const Outcome outcome = SyncOnce(seed, options, &self);
    rounds += outcome.rounds;
    relayed += outcome.relayed;
    if (!outcome.error.empty()) {
      ++failed;
      if (first_error.empty()) first_error = absl::StrCat("seed ", seed, ": ", outcome.error);
      std::replace(first_error.begin(), first_error.end(), '"', '\'');
    }
  }
  std::printf(
      "{\"seeds\": %lld, \"transport\": \"%s\", \"slow_link_us\": %lld, \"slow_unpack_us\": %lld, \"rounds\": %lld, "
      "\"relayed\": %lld, \"failed\": %lld, \"first_error\": \"%s\", \"agreement\": \"%s\", \"agree_median_us\": "
      "%.1f}\n",
      static_cast<long long>(seeds), transport.c_str(), static_cast<long long>(options.link_us),
      static_cast<long long>(options.unpack_us), static_cast<long long>(rounds), static_cast<long long>(relayed),
      static_cast<long long>(failed), first_error.c_str(), agreement.empty() ? "ok" : agreement.c_str(), agree_us);
  const bool agreed = agreement.empty() || !options.nccl_self;
  return failed == 0 && agreed ? 0 : 1;
}
