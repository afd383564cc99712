#include "daemon/coordinator/link_paths.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace shardsync::coordinator {
namespace {

bool OnCuda(const v1::JoinRequest& join) { return !join.device_uuid().empty(); }

bool CanMap(const v1::JoinRequest& a, const v1::JoinRequest& b) {
  if (a.host() != b.host() || a.node() != b.node()) return false;
  if (!OnCuda(a) && !OnCuda(b)) return true;
  if (!OnCuda(a) || !OnCuda(b)) return false;
  const auto reaches = [](const v1::JoinRequest& from, const v1::JoinRequest& to) {
    return from.device_uuid() == to.device_uuid() ||
           std::find(from.peer_device_uuids().begin(), from.peer_device_uuids().end(), to.device_uuid()) !=
               from.peer_device_uuids().end();
  };
  return reaches(a, b) && reaches(b, a);
}

}  // namespace

std::vector<int32_t> LinkPaths::DirectPeers(int32_t rank) const {
  std::vector<int32_t> peers;
  for (int32_t peer = 0; peer < world_size; ++peer) {
    if (peer != rank && Direct(rank, peer)) peers.push_back(peer);
  }
  return peers;
}

absl::StatusOr<LinkPaths> ChooseLinkPaths(const std::vector<v1::JoinRequest>& joins, DirectMode mode) {
  LinkPaths paths;
  const int32_t world = static_cast<int32_t>(joins.size());
  paths.world_size = world;
  paths.direct.assign(static_cast<size_t>(world) * world, false);
  for (int32_t rank = 0; rank < world; ++rank) paths.signal_boards.push_back(SignalBoardsFor(rank, joins));
  for (int32_t a = 0; a < world; ++a) {
    for (int32_t b = a + 1; b < world; ++b) {
      const bool can = CanMap(joins[a], joins[b]);
      if (mode == DirectMode::kAlways && !can) {
        return absl::FailedPreconditionError(absl::StrCat("--direct always: ranks ", a, " (", joins[a].host(), ", ",
                                                          joins[a].device(), ") and ", b, " (", joins[b].host(), ", ",
                                                          joins[b].device(), ") cannot map each other's memory"));
      }
      const bool direct = can && mode != DirectMode::kNever;
      paths.direct[a * world + b] = paths.direct[b * world + a] = direct;
      paths.any_direct = paths.any_direct || direct;
      paths.needs_communicator = paths.needs_communicator || (!direct && OnCuda(joins[a]) && OnCuda(joins[b]));
    }
  }
  if (!paths.needs_communicator) return paths;
  for (int32_t a = 0; a < world; ++a) {
    for (int32_t b = a + 1; b < world; ++b) {
      if (OnCuda(joins[a]) && joins[a].device_uuid() == joins[b].device_uuid() && joins[a].host() == joins[b].host()) {
        return absl::FailedPreconditionError(
            absl::StrCat("ranks ", a, " and ", b, " share CUDA device ", joins[a].device_uuid(),
                         ", and NCCL, which cannot hold two ranks on one device, must join ranks whose link is staged",
                         mode == DirectMode::kNever ? " (--direct never)" : ""));
      }
    }
  }
  return paths;
}

std::map<int32_t, std::string> SignalBoardsFor(int32_t rank, const std::vector<v1::JoinRequest>& joins) {
  std::map<int32_t, std::string> boards;
  if (joins[rank].signal_board().empty()) return boards;  // it reads none: it hears over its channel
  for (int32_t peer = 0; peer < static_cast<int32_t>(joins.size()); ++peer) {
    const v1::JoinRequest& join = joins[peer];
    if (peer != rank && !join.address().empty() && !join.signal_board().empty() && join.host() == joins[rank].host()) {
      boards[peer] = join.signal_board();
    }
  }
  return boards;
}

}  // namespace shardsync::coordinator
