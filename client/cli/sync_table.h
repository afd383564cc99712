// The stats table of one sync, as `shardsyncctl sync` and the local runner print it.
#pragma once

#include <ostream>

#include "proto/shardsync.pb.h"

namespace shardsync::cli {

// Per rank: bytes sent, received and copied locally, rounds, chunks, peak staging,
// seconds and effective GB/s ((received + local) / seconds); then the totals; then
// the links, when the response has them (SyncRequest.links).
void PrintSyncTable(const v1::SyncResponse& response, std::ostream& out);

}  // namespace shardsync::cli
