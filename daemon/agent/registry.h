// What local clients registered with this agent: their buffers, mapped and checked,
// and their tensor layouts. Thread-safe. Contract: a buffer's mapping lives as long as
// its client's registration or a running sync that holds it, whichever is longer.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/limits.h"
#include "common/unique_fd.h"
#include "executor/device.h"
#include "executor/memory.h"
#include "proto/shardsync.pb.h"

namespace shardsync::agent {

// Who registers: the process at the other end of the unix socket (SO_PEERCRED).
struct Peer {
  int32_t pid = 0;
  uint32_t uid = 0;
};

struct BufferEntry {
  std::string client_id;
  v1::Role role = v1::ROLE_UNSPECIFIED;
  std::shared_ptr<executor::MappedBuffer> memory;
  int64_t registered_at = 0;  // the registry's version its registration made
  // The token of what a client passed on the descriptor socket for it: a same-node peer
  // fetches the mapping's own descriptor (MappedBuffer::descriptor) by it.
  std::string descriptor_token;
};

// Descriptors a registration claimed from the descriptor socket, by token.
using ClaimedDescriptors = std::map<std::string, std::vector<UniqueFd>>;

// How many registrations an agent holds: each holds a call (a server thread) open.
struct RegistryLimits {
  int32_t clients = 256;                     // in all
  int32_t clients_per_uid = 64;              // from processes of one uid
  int64_t scratch_bytes = int64_t{2} << 30;  // the largest scratch allocated (float8 targets)
  int64_t tensors = kDefaultMaxTensors;      // in all registrations together
};

class Registry {
 public:
  Registry(int32_t rank, std::vector<executor::MemoryBackend*> backends, RegistryLimits limits = {})
      : rank_(rank), backends_(std::move(backends)), limits_(limits) {}

  // Opens and checks every buffer (handle, size, owned by `peer`'s uid where the memory
  // has an owner) and every placement (inside its buffer, inside its tensor, no
  // overlapping targets); sets this agent's rank on all of them. Refuses a second
  // registration of a client id or of a buffer name, and one past the limits
  // (RESOURCE_EXHAUSTED). `ready_event`: the client's, opened
  // by the device (request.ready_event), held as long as the registration.
  // `descriptors`: those of every descriptor_token the request names, closed once the
  // buffers are mapped (a mapping keeps a descriptor of its own) or refused.
  absl::Status Add(v1::RegisterRequest request, const Peer& peer,
                   std::shared_ptr<const executor::ReadyEvent> ready_event = nullptr,
                   ClaimedDescriptors descriptors = {});
  // Drops a client's registrations and mappings (a running sync keeps its own).
  void Remove(const std::string& client_id);
  // Memory of the agent's own (its signal board) that no client may register, `what`
  // naming it in refusals.
  void Reserve(executor::MemorySpan span, std::string what);

  // The layouts to publish, never the handles; `version` changes with every Add/Remove.
  std::vector<v1::PublishedLayout> Layouts(int64_t* version) const;
  int64_t version() const;
  std::shared_ptr<const BufferEntry> Find(const std::string& buffer) const;
  // A TARGET buffer's registration (name, bytes, handle) for a same-node peer that
  // writes it directly, and the version its registration made (BufferEntry::
  // registered_at); NOT_FOUND or PERMISSION_DENIED (a source) naming it.
  absl::StatusOr<v1::RegisteredBuffer> TargetHandle(const std::string& buffer, int64_t* registered_at) const;
  // Duplicates of the descriptors a TARGET buffer was registered with, by its token, for
  // a same-node peer (the descriptor socket's fetch); NOT_FOUND or PERMISSION_DENIED.
  absl::StatusOr<std::vector<UniqueFd>> TargetDescriptors(const std::string& token) const;
  // Maps a peer's target from its registration, with this agent's memory backends;
  // `descriptors`: those fetched for its descriptor_token.
  absl::StatusOr<std::unique_ptr<executor::MappedBuffer>> OpenPeer(const v1::RegisteredBuffer& buffer,
                                                                   const std::vector<UniqueFd>& descriptors) const;
  // This agent's own scratch for block-quantized targets (planner/quantize.h), named
  // planner::kScratchBufferName and `bytes` long, from the first backend that allocates:
  // found and handed to peers as a TARGET, never published, not a registration (the
  // version stays). One of another size replaces it; 0 drops it. A running sync keeps
  // what it holds.
  absl::Status ProvideScratch(int64_t bytes);
  std::vector<v1::ClientInfo> Clients() const;
  // The ready events of every client that gave one: a sync waits for them all.
  std::vector<std::shared_ptr<const executor::ReadyEvent>> ReadyEvents() const;

 private:
  struct Client {
    v1::RegisterRequest request;  // handles included, kept here only
    std::vector<std::string> buffers;
    Peer peer;
    std::shared_ptr<const executor::ReadyEvent> ready_event;
  };

  // INVALID_ARGUMENT naming both when a buffer of `opened` (the registering client's)
  // is memory of the agent's own, or overlaps a registered or opened buffer where either
  // is a target: a target is written, and nothing else may see those writes.
  absl::Status CheckOverlaps(const std::map<std::string, std::shared_ptr<BufferEntry>>& opened) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED when `peer` may not add one more registration, of `tensors`.
  absl::Status CheckLimits(const std::string& client_id, const Peer& peer, int64_t tensors) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int32_t rank_;
  // The scratch's registration as peers receive it (ProvideScratch), and how many were
  // made: the n-th has registered_at -n, apart from every client's.
  absl::Mutex scratch_mu_;  // one ProvideScratch at a time (the owner's Prepare, a peer's ask)
  v1::RegisteredBuffer scratch_ ABSL_GUARDED_BY(mu_);
  int64_t scratch_made_ ABSL_GUARDED_BY(mu_) = 0;
  const std::vector<executor::MemoryBackend*> backends_;
  const RegistryLimits limits_;
  mutable absl::Mutex mu_;
  std::map<std::string, Client> clients_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<BufferEntry>> buffers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> by_token_ ABSL_GUARDED_BY(mu_);  // buffers passed as descriptors
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::pair<executor::MemorySpan, std::string>> reserved_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardsync::agent
