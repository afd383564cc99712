// Makes the agent_requests_fuzzer's seed corpus: for a world of 1 and of 2 ranks, each
// rank's agent registering a ZeRO-3 source and a whole target of one tensor, preparing
// the schedule the coordinator's own code makes, syncing, and the requests that follow
// (a cached Prepare, verify, a peer's chunk, an abort, a client leaving mid-epoch).
//   bazel run //tests/fuzz:make_agent_seeds -- OUT_DIR
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include "daemon/agent/registry.h"
#include "daemon/coordinator/epoch_plan.h"
#include "tests/agent/heap_backend.h"
#include "tests/agent/one_tensor.h"
#include "tests/fuzz/agent_requests.h"

namespace {

using namespace shardsync;

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "make_agent_seeds: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_agent_seeds OUT_DIR\n");
    return 2;
  }
  constexpr int64_t kStaging = 4096;
  for (int32_t world : {1, 2}) {
    // Every rank's layouts, as the coordinator would hold them, planned as it plans.
    std::map<int32_t, v1::PublishRequest> published;
    for (int32_t r = 0; r < world; ++r) {
      agent::HeapBackend backend;
      agent::Registry registry(r, {&backend});
      for (const v1::RegisterRequest& request : {agent::ZeroThreeTrainer(r, world), agent::WholeRollout(r)}) {
        if (absl::Status added = registry.Add(request, agent::Peer{}); !added.ok()) return Fail(added);
      }
      int64_t version = 0;
      published[r].set_rank(r);
      for (v1::PublishedLayout& layout : registry.Layouts(&version)) *published[r].add_layouts() = layout;
    }
    coordinator::EpochOptions options;
    options.world_size = world;
    options.staging_bytes = kStaging;
    auto epoch = coordinator::PlanEpoch(published, {}, {}, options);
    if (!epoch.ok()) return Fail(epoch.status());
    for (int32_t rank = 0; rank < world; ++rank) {
      v1::PrepareRequest prepare = *coordinator::ScheduleRequest(*epoch, rank);
      prepare.set_sync_id("sync-1");
      prepare.set_digest(epoch->digest());
      prepare.set_staging_bytes(kStaging);
      prepare.set_deadline_ms(5);
      prepare.set_communicator_generation(1);
      prepare.set_world_size(world);
      if (world > 1) (*prepare.mutable_peer_addresses())[1 - rank] = "127.0.0.1:1";
      v1::ExecuteRequest execute;
      execute.set_sync_id("sync-1");
      execute.set_digest(epoch->digest());
      v1::ExecuteRequest cached = execute;
      cached.set_sync_id("sync-2");
      cached.set_verify(true);
      v1::PrepareRequest again = prepare;
      again.clear_segment_table();
      again.clear_segment_count();
      again.clear_tensor_names();
      again.clear_buffer_names();
      again.clear_fills();
      again.clear_stages();
      again.set_schedule_cached(true);
      again.set_sync_id("sync-2");
      *cached.mutable_prepare() = again;
      v1::TransferRequest transfer;
      transfer.set_sync_id("sync-2");
      transfer.set_from_rank(1 - rank);
      transfer.set_data(std::string(64, '\x5a'));
      v1::AbortRequest abort;
      abort.set_sync_id("sync-2");
      abort.set_reason("seed");

      std::string input = std::string(1, static_cast<char>(fuzz::WorldByte(world, rank)));
      fuzz::AppendRecord(&input, fuzz::AgentOp::kRegister, agent::ZeroThreeTrainer(rank, world).SerializeAsString());
      fuzz::AppendRecord(&input, fuzz::AgentOp::kRegister, agent::WholeRollout(rank).SerializeAsString());
      fuzz::AppendRecord(&input, fuzz::AgentOp::kPrepare, prepare.SerializeAsString());
      fuzz::AppendRecord(&input, fuzz::AgentOp::kExecute, execute.SerializeAsString());
      fuzz::AppendRecord(&input, fuzz::AgentOp::kExecute, cached.SerializeAsString());
      fuzz::AppendRecord(&input, fuzz::AgentOp::kTransfer, transfer.SerializeAsString());
      fuzz::AppendRecord(&input, fuzz::AgentOp::kAbort, abort.SerializeAsString());
      fuzz::AppendRecord(&input, fuzz::AgentOp::kReport, "");
      fuzz::AppendRecord(&input, fuzz::AgentOp::kWithdraw, "rollout");
      fuzz::AppendRecord(&input, fuzz::AgentOp::kExecute, cached.SerializeAsString());
      fuzz::AppendRecord(&input, fuzz::AgentOp::kReport, "");
      const std::string name =
          std::string(argv[1]) + "/seed-world" + std::to_string(world) + "-r" + std::to_string(rank);
      std::ofstream(name, std::ios::binary) << input;
    }
  }
  return 0;
}
