// The coordinator's flags, for both mains that host a coordinator
// (shardsync-coordinator, shardsync-agent --serve-coordinator): the world, the staging
// budget, the sync deadline, the relay across nodes and the cost model that decides it.
#pragma once

#include <vector>

#include "common/flags.h"
#include "common/limits.h"
#include "daemon/coordinator/coordinator.h"

namespace shardsync::coordinator {

// Adds --world, --staging-bytes, --sync-timeout-ms, --relay, --direct, --link-gbps,
// --network-gbps, --memory-gbps, --shared-source-uids and --plan-dir, parsed into `config`. Returns the options, for a
// main that accepts them only with another flag.
std::vector<CLI::Option*> AddCoordinatorFlags(CLI::App& app, CoordinatorConfig& config);

}  // namespace shardsync::coordinator
