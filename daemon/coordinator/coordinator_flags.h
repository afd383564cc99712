// The coordinator's planning flags, for both mains that host a coordinator
// (shardsync-coordinator, shardsync-agent --serve-coordinator): the relay across nodes
// and the cost model that decides it.
#pragma once

#include <string>

#include "common/flags.h"
#include "daemon/coordinator/coordinator.h"

namespace shardsync::coordinator {

// Their lines for --help.
extern const char kPlanningHelp[];

// Takes --relay, --link-gbps, --network-gbps and --memory-gbps into `config`. Returns
// what is wrong with them, or an empty string.
std::string TakePlanningFlags(Flags& flags, CoordinatorConfig& config);

}  // namespace shardsync::coordinator
