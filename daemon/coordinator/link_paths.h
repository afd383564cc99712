// Which path the bytes between two agents take: DIRECT (the sender writes the
// receiver's targets through CUDA IPC or host shared memory, no staging) or STAGED
// (packed into staging and sent over the transport: NCCL between CUDA devices, the
// agents' gRPC between host memories). Also the path of the agents' host messages
// (agreement, completion): signal boards between agents of one host. Pure functions
// of the agents' joins.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/shardsync.pb.h"

namespace shardsync::coordinator {

// --direct: where agents can map each other's memory (auto), nowhere, or between
// every pair (a pair that cannot is refused).
enum class DirectMode { kAuto, kNever, kAlways };

struct LinkPaths {
  int32_t world_size = 0;
  std::vector<bool> direct;         // [from * world_size + to], symmetric
  bool needs_communicator = false;  // some pair of CUDA agents is staged: NCCL joins every rank
  bool any_direct = false;          // some pair links directly
  std::vector<std::map<int32_t, std::string>> signal_boards;  // by rank: SignalBoardsFor
  bool Direct(int32_t from, int32_t to) const { return direct[from * world_size + to]; }
  std::vector<int32_t> DirectPeers(int32_t rank) const;  // ascending
  // Every rank reaches every other through its signal board (one host): the agreement
  // is host messages alone.
  bool AllOnSignalBoards() const {
    for (const auto& boards : signal_boards) {
      if (static_cast<int32_t>(boards.size()) != world_size - 1) return false;
    }
    return !signal_boards.empty();
  }
  v1::LinkPath Path(int32_t from, int32_t to) const { return Direct(from, to) ? v1::DIRECT : v1::STAGED; }
};

// Two agents can map each other's memory when they run on one host (the same host
// name and node) and both on host memory, or both on one CUDA device, or on CUDA
// devices with peer access (JoinRequest.peer_device_uuids). `joins` by rank, every rank
// present. Refuses (FAILED_PRECONDITION, naming the ranks) a pair kAlways cannot map,
// and agents that share a CUDA device when NCCL must join them (kNever, or another pair
// is staged): NCCL cannot hold two ranks on one device.
absl::StatusOr<LinkPaths> ChooseLinkPaths(const std::vector<v1::JoinRequest>& joins, DirectMode mode);

// The signal boards (JoinRequest.signal_board) of the other agents on the host of
// `rank`, by rank: its host messages to them go through the boards. `joins` by rank;
// a rank that has not joined (no address) has none, and a rank without a board of its
// own gets none (its peers reach it over its channel, so it reaches them so too).
std::map<int32_t, std::string> SignalBoardsFor(int32_t rank, const std::vector<v1::JoinRequest>& joins);

}  // namespace shardsync::coordinator
