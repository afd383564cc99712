#include "executor/transport.h"

#include <vector>

#include "common/status_macros.h"

namespace shardsync::executor {

absl::StatusOr<bool> Transport::Agree(absl::string_view sync_id, const PeerSetup& peers, bool ready,
                                      absl::Time deadline) {
  if (device_memory()) return absl::UnimplementedError("this device transport has no agreement");
  const uint8_t vote = ready ? 1 : 0;
  std::vector<uint8_t> votes(peers.world_size, 0);
  std::vector<SendOp> sends;
  std::vector<RecvOp> receives;
  for (int32_t r = 0; r < peers.world_size; ++r) {
    if (r == peers.rank) continue;
    sends.push_back(SendOp{r, &vote, 1});
    receives.push_back(RecvOp{r, &votes[r], 1});
  }
  SHARDSYNC_RETURN_IF_ERROR(RunRound(sync_id, kAgreementRound, sends, receives, deadline));
  bool all = ready;
  for (const RecvOp& r : receives) all = all && *r.data == 1;
  return all;
}

}  // namespace shardsync::executor
