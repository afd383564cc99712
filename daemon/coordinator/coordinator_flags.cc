#include "daemon/coordinator/planning_flags.h"

namespace shardsync::coordinator {

const char kPlanningHelp[] = R"(  --relay MODE           bytes between nodes (agents' --node): auto (default) relays when
                         the cost model's floor is lower: each piece crosses the network
                         once into one replica on a node, the others copy it there;
                         always; never
  --link-gbps G          the cost model: GB/s one way per rank within a node (default 360)
  --network-gbps G       GB/s one way per rank between nodes (default 50)
  --memory-gbps G        GB/s of device memory, read + write (default 4200)
)";

std::string TakePlanningFlags(Flags& flags, CoordinatorConfig& config) {
  const absl::StatusOr<planner::RelayMode> relay = planner::ParseRelayMode(flags.Take("relay", "auto"));
  planner::Bandwidths& bw = config.bandwidths;
  bw.link_bytes_per_s = flags.TakeNumber<double>("link-gbps", bw.link_bytes_per_s / 1e9) * 1e9;
  bw.network_bytes_per_s = flags.TakeNumber<double>("network-gbps", bw.network_bytes_per_s / 1e9) * 1e9;
  bw.memory_bytes_per_s = flags.TakeNumber<double>("memory-gbps", bw.memory_bytes_per_s / 1e9) * 1e9;
  if (!relay.ok()) return "--relay: " + std::string(relay.status().message());
  config.relay = *relay;
  if (!(bw.link_bytes_per_s > 0 && bw.network_bytes_per_s > 0 && bw.memory_bytes_per_s > 0)) {
    return "--link-gbps, --network-gbps and --memory-gbps must be positive";
  }
  return "";
}

}  // namespace shardsync::coordinator
