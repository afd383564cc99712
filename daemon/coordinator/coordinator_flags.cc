#include "daemon/coordinator/coordinator_flags.h"

#include <map>
#include <string>

#include "planner/schedule.h"

namespace shardsync::coordinator {
namespace {

// A speed flag in GB/s, kept in bytes per second.
CLI::Option* AddSpeed(CLI::App& app, const std::string& name, double& bytes_per_s, const std::string& help) {
  return app
      .add_option_function<double>(
          name, [&bytes_per_s](double gbps) { bytes_per_s = gbps * 1e9; }, help)
      ->check(flags::kPositive)
      ->default_str(std::to_string(static_cast<int64_t>(bytes_per_s / 1e9)));
}

}  // namespace

std::vector<CLI::Option*> AddCoordinatorFlags(CLI::App& app, CoordinatorConfig& config) {
  std::vector<CLI::Option*> options;
  options.push_back(flags::AddInt(app, "--world", config.world_size, "number of agents (ranks 0..N-1)", 1, kMaxWorld));
  options.push_back(flags::AddInt(app, "--max-tensors", config.max_tensors,
                                  "tensors one rank holds: an agent refuses a registration past it (its "
                                  "registrations together), the coordinator a publication",
                                  int64_t{1}));
  options.push_back(flags::AddInt(app, "--staging-bytes", config.staging_bytes,
                                  "staging budget per peer, both directions, bytes", planner::kMinStagingBytes));
  options.push_back(flags::AddInt(app, "--scratch-bytes", config.scratch_bytes,
                                  "bfloat16 scratch per agent for block-quantized float8 targets, bytes: their "
                                  "tensors are synced in groups that fit it",
                                  int64_t{64} << 10));
  options.push_back(flags::AddMilliseconds(app, "--sync-timeout-ms", config.sync_timeout,
                                           "default deadline of a sync's Execute", 1, 86400000));
  const std::map<std::string, planner::RelayMode> relay_modes{{"auto", planner::RelayMode::kAuto},
                                                              {"always", planner::RelayMode::kAlways},
                                                              {"never", planner::RelayMode::kNever}};
  options.push_back(app.add_option("--relay", config.relay,
                                   "bytes between nodes (agents' --node): auto relays when the cost model's floor is "
                                   "lower (each piece crosses the network once into one replica on a node, the others "
                                   "copy it there); always; never")
                        ->transform(CLI::CheckedTransformer(relay_modes))
                        ->default_str("auto"));
  const std::map<std::string, DeltaMode> delta_modes{
      {"off", DeltaMode::kOff}, {"auto", DeltaMode::kAuto}, {"always", DeltaMode::kAlways}};
  options.push_back(app.add_option("--delta", config.delta,
                                   "delta sync between CPU agents: a chunk goes as its changed bits where the "
                                   "receiving rank's targets hold the sync the sender kept of it (agent "
                                   "--delta-snapshot-bytes); auto on links between nodes, always on every staged "
                                   "link, off")
                        ->transform(CLI::CheckedTransformer(delta_modes))
                        ->default_str("off"));
  const std::map<std::string, DirectMode> direct_modes{
      {"auto", DirectMode::kAuto}, {"always", DirectMode::kAlways}, {"never", DirectMode::kNever}};
  options.push_back(app.add_option("--direct", config.direct,
                                   "agents of one host that can map each other's memory (one CUDA device, devices "
                                   "with peer access, or host memory): auto writes the receiver's targets directly "
                                   "(CUDA IPC or shared memory, no staging); never stages every link through the "
                                   "transport; always refuses agents that cannot")
                        ->transform(CLI::CheckedTransformer(direct_modes))
                        ->default_str("auto"));
  options.push_back(AddSpeed(app, "--link-gbps", config.bandwidths.link_bytes_per_s,
                             "the cost model: GB/s one way per rank within a node"));
  options.push_back(AddSpeed(app, "--network-gbps", config.bandwidths.network_bytes_per_s,
                             "the cost model: GB/s one way per rank between nodes"));
  options.push_back(AddSpeed(app, "--memory-gbps", config.bandwidths.memory_bytes_per_s,
                             "the cost model: GB/s of device memory, read + write"));
  options.push_back(app.add_option("--shared-source-uids", config.shared_source_uids,
                                   "uids whose processes may be sources of one tensor together (replicas from several "
                                   "users); by default a tensor's sources all come from one uid")
                        ->delimiter(',')
                        ->check(flags::kDecimal));
  options.push_back(app.add_option("--plan-dir", config.plan_dir,
                                   "directory of the file (unlinked when made) that holds each rank's planned "
                                   "segments until its schedule is sent: a plan's memory stays one rank's")
                        ->check(CLI::ExistingDirectory)
                        ->default_str("$TMPDIR, else /var/tmp"));
  for (CLI::Option* option : options) option->group("Coordinator");
  return options;
}

}  // namespace shardsync::coordinator
