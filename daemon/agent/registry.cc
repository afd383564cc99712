#include "daemon/agent/registry.h"

#include <fcntl.h>
#include <malloc.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "planner/quantize.h"
#include "planner/validate.h"
#include "spec/layout_spec.h"

namespace shardsync::agent {
namespace {

// Buffer names clients may not register: the agent's own (planner::kScratchBufferName).
constexpr char kReservedPrefix[] = "shardsync.";

// `descriptors`: those of the handle's descriptor_token, borrowed by the handle.
absl::StatusOr<executor::MemoryHandle> ToHandle(const v1::MemoryHandle& in, const std::vector<UniqueFd>& descriptors) {
  executor::MemoryHandle handle;
  handle.shm_name = in.shm_name();
  handle.cuda_ipc_handle = in.cuda_ipc_handle();
  handle.offset_bytes = in.offset_bytes();
  handle.device = in.device();
  if (in.kind_case() == v1::MemoryHandle::kDescriptorToken) {
    if (in.device() >= 0) {
      return absl::InvalidArgumentError(
          "device memory passed as descriptors is not taken by this agent: give its CUDA IPC handle");
    }
    if (descriptors.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat("host memory is passed as one descriptor; token '",
                                                     in.descriptor_token(), "' carries ", descriptors.size()));
    }
    handle.fd = descriptors[0].get();
  }
  return handle;
}

// A handle no backend of this agent takes: what memory it is, what the agent takes, and
// where that memory goes instead.
absl::Status NotTaken(const std::string& who, const executor::MemoryHandle& handle,
                      const std::vector<executor::MemoryBackend*>& backends) {
  const bool host = handle.host_memory();
  if (handle.cuda_ipc_handle.empty() && !host) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": its handle names no memory (no shared memory name, descriptor or CUDA IPC handle)"));
  }
  std::vector<std::string> taken;
  for (const executor::MemoryBackend* backend : backends) taken.emplace_back(backend->name());
  const std::string kind = host ? "host memory" : absl::StrCat("memory of CUDA device ", handle.device);
  return absl::InvalidArgumentError(absl::StrCat(who, ": ", kind, " is not taken by this agent (it takes ",
                                                 absl::StrJoin(taken, ", "), "): host memory goes to an agent of ",
                                                 "--device cpu, CUDA memory to the agent of its device"));
}

// The request's layouts checked with the planner's own rules, on this rank alone.
absl::Status CheckLayouts(const v1::RegisterRequest& request, int32_t rank) {
  spec::BufferIds ids;
  planner::PlanInput input;
  for (const v1::RegisteredBuffer& b : request.buffers()) {
    // Named as registered: the refusal names the client once, before the planner's words.
    input.buffers.push_back(planner::Buffer{planner::Holder{rank, ids.Id(b.name())}, b.bytes(), b.name()});
  }
  const size_t registered = ids.names().size();
  for (const v1::TensorLayout& t : request.tensors()) {
    SHARDSYNC_ASSIGN_OR_RETURN(auto side, spec::ToTensorSide(t, ids));
    if (ids.names().size() > registered) {  // a name no buffer has
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name(), "' names buffer '",
                                                     ids.Name(static_cast<int32_t>(registered)),
                                                     "', which this registration does not register"));
    }
    planner::TensorLayouts layouts{side.name, side.shape, side.dtype, side.dtype, {}, {}};
    (request.role() == v1::SOURCE ? layouts.source : layouts.target) = side.layout;
    if (!side.scales.empty()) {  // a quantized target: any source dtype it takes will do here
      layouts.source_dtype = planner::DType::kBFloat16;
      layouts.target_scales = side.scales;
    }
    input.tensors.push_back(std::move(layouts));
  }
  return planner::ValidatePlanInput(input);
}

}  // namespace

absl::Status Registry::Add(v1::RegisterRequest request, const Peer& peer,
                           std::shared_ptr<const executor::ReadyEvent> ready_event, ClaimedDescriptors descriptors) {
  if (request.client_id().empty()) return absl::InvalidArgumentError("a registration needs a client_id");
  if (request.role() != v1::SOURCE && request.role() != v1::TARGET) {
    return absl::InvalidArgumentError(
        absl::StrCat("client '", request.client_id(), "': role must be SOURCE or TARGET"));
  }
  if (!request.ready_event().empty() && request.role() != v1::SOURCE) {
    return absl::InvalidArgumentError(absl::StrCat(
        "client '", request.client_id(), "': only a SOURCE gives a ready event (the writes a sync waits for)"));
  }
  for (const v1::RegisteredBuffer& b : request.buffers()) {
    if (absl::StartsWith(b.name(), kReservedPrefix)) {
      return absl::InvalidArgumentError(absl::StrCat("client '", request.client_id(), "' buffer '", b.name(),
                                                     "': names starting '", kReservedPrefix, "' are the agent's"));
    }
  }
  for (v1::TensorLayout& t : *request.mutable_tensors()) {
    for (v1::Placement& p : *t.mutable_placements()) p.set_rank(rank_);
    for (v1::FlatPlacement& p : *t.mutable_flat_placements()) p.set_rank(rank_);
    for (v1::Fill& f : *t.mutable_fills()) f.set_rank(rank_);
    for (v1::BlockScales& s : *t.mutable_block_scales()) s.set_rank(rank_);
  }
  {
    absl::MutexLock lock(&mu_);  // before the work of opening buffers; again when adding
    SHARDSYNC_RETURN_IF_ERROR(CheckLimits(request.client_id(), peer, request.tensors_size()));
  }
  if (auto s = CheckLayouts(request, rank_); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("client '", request.client_id(), "': ", s.message()));
  }
  // Map every buffer before taking the lock: opening may be slow.
  std::map<std::string, std::shared_ptr<BufferEntry>> opened;
  for (const v1::RegisteredBuffer& b : request.buffers()) {
    const std::string& token = b.handle().descriptor_token();
    std::vector<UniqueFd> passed;
    if (!token.empty()) {
      auto claimed = descriptors.find(token);
      if (claimed == descriptors.end()) {
        return absl::InvalidArgumentError(absl::StrCat("client '", request.client_id(), "' buffer '", b.name(),
                                                       "': descriptor token '", token, "' was not claimed for it"));
      }
      passed = std::move(claimed->second);
      descriptors.erase(claimed);
    }
    absl::StatusOr<executor::MemoryHandle> handle = ToHandle(b.handle(), passed);
    if (!handle.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("client '", request.client_id(), "' buffer '", b.name(), "': ", handle.status().message()));
    }
    executor::MemoryBackend* backend = nullptr;
    for (executor::MemoryBackend* candidate : backends_) {
      if (candidate->Accepts(*handle)) backend = candidate;
    }
    if (backend == nullptr) {
      return NotTaken(absl::StrCat("client '", request.client_id(), "' buffer '", b.name(), "'"), *handle, backends_);
    }
    auto memory = backend->Open(*handle, b.bytes());
    if (!memory.ok()) {
      return absl::Status(memory.status().code(), absl::StrCat("client '", request.client_id(), "' buffer '", b.name(),
                                                               "': ", memory.status().message()));
    }
    // A client registers only its own memory: host shared memory of another user is
    // refused even where the agent could open it.
    if (const std::optional<uint32_t> owner = (*memory)->owner_uid(); owner && *owner != peer.uid) {
      return absl::PermissionDeniedError(
          absl::StrCat("client '", request.client_id(), "' buffer '", b.name(), "': the memory belongs to uid ", *owner,
                       ", not to the registering process (pid ", peer.pid, ", uid ", peer.uid, ")"));
    }
    if (opened.count(b.name())) {
      return absl::InvalidArgumentError(
          absl::StrCat("client '", request.client_id(), "' names buffer '", b.name(), "' twice"));
    }
    auto entry = std::make_shared<BufferEntry>();
    entry->client_id = request.client_id();
    entry->role = request.role();
    entry->memory = std::shared_ptr<executor::MappedBuffer>(std::move(*memory));
    entry->descriptor_token = token;
    opened[b.name()] = std::move(entry);
  }
  absl::MutexLock lock(&mu_);
  if (clients_.count(request.client_id())) {
    return absl::AlreadyExistsError(absl::StrCat("client '", request.client_id(), "' is already registered"));
  }
  SHARDSYNC_RETURN_IF_ERROR(CheckLimits(request.client_id(), peer, request.tensors_size()));
  for (const auto& [name, entry] : opened) {
    if (const auto held = buffers_.find(name); held != buffers_.end()) {
      return absl::AlreadyExistsError(
          absl::StrCat("client '", request.client_id(), "' buffer '", name, "' is already registered on rank ", rank_,
                       " by client '", held->second->client_id, "': buffer names are unique among an agent's clients"));
    }
  }
  SHARDSYNC_RETURN_IF_ERROR(CheckOverlaps(opened));
  Client client;
  ++version_;
  for (auto& [name, entry] : opened) {
    client.buffers.push_back(name);
    entry->registered_at = version_;
    buffers_[name] = entry;
    if (!entry->descriptor_token.empty()) by_token_[entry->descriptor_token] = name;
  }
  client.request = std::move(request);
  client.peer = peer;
  client.ready_event = std::move(ready_event);
  clients_[client.request.client_id()] = std::move(client);
  return absl::OkStatus();
}

void Registry::Remove(const std::string& client_id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = clients_.find(client_id);
    if (it == clients_.end()) return;
    for (const std::string& name : it->second.buffers) {
      by_token_.erase(buffers_.at(name)->descriptor_token);
      buffers_.erase(name);
    }
    clients_.erase(it);
    ++version_;
  }
  // A large registration's layouts leave free heap that malloc would keep.
  malloc_trim(0);
}

void Registry::Reserve(executor::MemorySpan span, std::string what) {
  absl::MutexLock lock(&mu_);
  reserved_.emplace_back(std::move(span), std::move(what));
}

absl::Status Registry::CheckOverlaps(const std::map<std::string, std::shared_ptr<BufferEntry>>& opened) const {
  // Every span, by object and start, in one sweep: a span overlaps an earlier one of its
  // object exactly when it starts before the furthest end so far. Spans registered
  // earlier were kept apart when they came, so only pairs with a new one are looked at.
  struct Held {
    executor::MemorySpan span;
    const std::string* name;   // a buffer's, or what the agent's own memory is
    const BufferEntry* entry;  // null for the agent's own memory
    bool fresh;                // of this registration
    bool exclusive() const { return entry == nullptr || entry->role == v1::TARGET; }  // shared by nothing
  };
  std::vector<Held> spans;
  for (const auto& [span, what] : reserved_) spans.push_back({span, &what, nullptr, false});
  for (const auto& [name, entry] : buffers_) spans.push_back({entry->memory->span(), &name, entry.get(), false});
  for (const auto& [name, entry] : opened) spans.push_back({entry->memory->span(), &name, entry.get(), true});
  std::sort(spans.begin(), spans.end(), [](const Held& a, const Held& b) {
    return std::tie(a.span.object, a.span.begin) < std::tie(b.span.object, b.span.begin);
  });
  const Held* reach = nullptr;      // the furthest-reaching span of this object so far
  const Held* exclusive = nullptr;  // the same among the exclusive ones
  for (const Held& held : spans) {
    if (reach != nullptr && reach->span.object != held.span.object) reach = exclusive = nullptr;
    // Sources may share memory with sources; nothing may share it with the others.
    const Held* other = held.exclusive() ? reach : exclusive;
    if (other != nullptr && other->span.end > held.span.begin && (held.fresh || other->fresh)) {
      const Held& added = held.fresh ? held : *other;
      const Held& there = held.fresh ? *other : held;
      if (there.entry == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("client '", added.entry->client_id, "' buffer '", *added.name,
                                                       "': its memory is ", *there.name));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "client '", added.entry->client_id, "' buffer '", *added.name, "': its memory overlaps buffer '", *there.name,
          "' of client '", there.entry->client_id, "', a ", v1::Role_Name(there.entry->role)));
    }
    if (reach == nullptr || held.span.end > reach->span.end) reach = &held;
    if (held.exclusive() && (exclusive == nullptr || held.span.end > exclusive->span.end)) exclusive = &held;
  }
  return absl::OkStatus();
}

absl::Status Registry::CheckLimits(const std::string& client_id, const Peer& peer, int64_t tensors) const {
  if (static_cast<int32_t>(clients_.size()) >= limits_.clients) {
    return absl::ResourceExhaustedError(absl::StrCat("client '", client_id, "': this agent holds ", clients_.size(),
                                                     " registrations, its limit (--max-registrations)"));
  }
  int32_t of_uid = 0;
  int64_t held = 0;
  for (const auto& [id, client] : clients_) {
    of_uid += client.peer.uid == peer.uid;
    held += client.request.tensors_size();
  }
  if (held + tensors > limits_.tensors) {
    return absl::ResourceExhaustedError(absl::StrCat("client '", client_id, "': its ", tensors, " tensors beside the ",
                                                     held, " held are past this agent's limit ", limits_.tensors,
                                                     " (--max-tensors)"));
  }
  if (of_uid >= limits_.clients_per_uid) {
    return absl::ResourceExhaustedError(
        absl::StrCat("client '", client_id, "': uid ", peer.uid, " holds ", of_uid,
                     " registrations, the limit per uid (--max-registrations-per-uid)"));
  }
  return absl::OkStatus();
}

std::vector<v1::PublishedLayout> Registry::Layouts(int64_t* version) const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::PublishedLayout> layouts;
  for (const auto& [id, client] : clients_) {
    v1::PublishedLayout layout;
    layout.set_client_id(id);
    layout.set_role(client.request.role());
    layout.set_uid(client.peer.uid);
    for (const v1::RegisteredBuffer& b : client.request.buffers()) {
      v1::BufferInfo* info = layout.add_buffers();
      info->set_rank(rank_);
      info->set_name(b.name());
      info->set_bytes(b.bytes());
    }
    *layout.mutable_tensors() = client.request.tensors();
    layouts.push_back(std::move(layout));
  }
  if (version) *version = version_;
  return layouts;
}

int64_t Registry::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

std::shared_ptr<const BufferEntry> Registry::Find(const std::string& buffer) const {
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find(buffer);
  return it == buffers_.end() ? nullptr : it->second;
}

absl::StatusOr<v1::RegisteredBuffer> Registry::TargetHandle(const std::string& buffer, int64_t* registered_at) const {
  absl::MutexLock lock(&mu_);
  auto entry = buffers_.find(buffer);
  if (entry == buffers_.end()) {
    return absl::NotFoundError(absl::StrCat("buffer '", buffer, "' is not registered on rank ", rank_));
  }
  if (entry->second->role != v1::TARGET) {
    return absl::PermissionDeniedError(absl::StrCat("buffer '", buffer, "' on rank ", rank_, " is a ",
                                                    v1::Role_Name(entry->second->role), ": peers write only targets"));
  }
  *registered_at = entry->second->registered_at;
  if (buffer == planner::kScratchBufferName) return scratch_;
  for (const v1::RegisteredBuffer& b : clients_.at(entry->second->client_id).request.buffers()) {
    if (b.name() == buffer) return b;
  }
  return absl::InternalError(absl::StrCat("buffer '", buffer, "' has no registration"));
}

absl::StatusOr<std::vector<UniqueFd>> Registry::TargetDescriptors(const std::string& token) const {
  absl::MutexLock lock(&mu_);
  const auto named = by_token_.find(token);
  if (named == by_token_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no target registered on rank ", rank_, " under descriptor token '", token, "'"));
  }
  const BufferEntry& entry = *buffers_.at(named->second);
  if (entry.role != v1::TARGET) {
    return absl::PermissionDeniedError(absl::StrCat("buffer '", named->second, "' on rank ", rank_, " is a ",
                                                    v1::Role_Name(entry.role), ": peers write only targets"));
  }
  if (entry.memory->descriptor() < 0) {
    return absl::InternalError(absl::StrCat("buffer '", named->second, "' on rank ", rank_,
                                            " was passed as descriptors, but its mapping keeps none"));
  }
  std::vector<UniqueFd> copies;
  copies.emplace_back(fcntl(entry.memory->descriptor(), F_DUPFD_CLOEXEC, 0));
  if (!copies.back().valid()) {
    return absl::ResourceExhaustedError(absl::StrCat("buffer '", named->second, "': dup: ", std::strerror(errno)));
  }
  return copies;
}

absl::StatusOr<std::unique_ptr<executor::MappedBuffer>> Registry::OpenPeer(
    const v1::RegisteredBuffer& buffer, const std::vector<UniqueFd>& descriptors) const {
  absl::StatusOr<executor::MemoryHandle> handle = ToHandle(buffer.handle(), descriptors);
  if (!handle.ok())
    return absl::InvalidArgumentError(absl::StrCat("buffer '", buffer.name(), "': ", handle.status().message()));
  for (executor::MemoryBackend* backend : backends_) {
    if (backend->Accepts(*handle)) return backend->OpenPeer(*handle, buffer.bytes());
  }
  return NotTaken(absl::StrCat("buffer '", buffer.name(), "'"), *handle, backends_);
}

absl::Status Registry::ProvideScratch(int64_t bytes) {
  if (bytes < 0 || bytes > limits_.scratch_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a scratch of ", bytes, " bytes is outside this agent's --max-scratch-bytes (", limits_.scratch_bytes, ")"));
  }
  absl::MutexLock one_at_a_time(&scratch_mu_);
  {
    absl::MutexLock lock(&mu_);
    const bool held = buffers_.count(planner::kScratchBufferName) > 0;
    if (held && scratch_.bytes() == bytes) return absl::OkStatus();
    if (held) buffers_.erase(planner::kScratchBufferName);
    scratch_.Clear();
  }
  if (bytes == 0) return absl::OkStatus();
  absl::Status failed = absl::FailedPreconditionError("this agent has no memory backend");
  for (executor::MemoryBackend* backend : backends_) {
    absl::StatusOr<executor::MemoryBackend::Owned> owned = backend->Allocate(bytes);
    if (absl::IsUnimplemented(owned.status())) continue;
    if (!owned.ok()) {
      failed = owned.status();
      break;
    }
    v1::RegisteredBuffer registration;
    registration.set_name(planner::kScratchBufferName);
    registration.set_bytes(bytes);
    v1::MemoryHandle& handle = *registration.mutable_handle();  // its kinds are a oneof
    if (!owned->handle.shm_name.empty()) handle.set_shm_name(owned->handle.shm_name);
    if (!owned->handle.cuda_ipc_handle.empty()) handle.set_cuda_ipc_handle(owned->handle.cuda_ipc_handle);
    handle.set_device(owned->handle.device);
    absl::MutexLock lock(&mu_);
    auto entry = std::make_shared<BufferEntry>();
    entry->client_id = kReservedPrefix;
    entry->role = v1::TARGET;
    entry->memory = std::shared_ptr<executor::MappedBuffer>(std::move(owned->buffer));
    entry->registered_at = -++scratch_made_;
    buffers_[planner::kScratchBufferName] = std::move(entry);
    scratch_ = std::move(registration);
    return absl::OkStatus();
  }
  return absl::Status(failed.code(), absl::StrCat("scratch of ", bytes, " bytes on rank ", rank_,
                                                  " for block-quantized targets: ", failed.message()));
}

std::vector<v1::ClientInfo> Registry::Clients() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::ClientInfo> out;
  for (const auto& [id, client] : clients_) {
    v1::ClientInfo info;
    info.set_client_id(id);
    info.set_role(client.request.role());
    info.set_buffers(client.request.buffers_size());
    int64_t bytes = 0;
    for (const v1::RegisteredBuffer& b : client.request.buffers()) bytes += b.bytes();
    info.set_bytes(bytes);
    info.set_tensors(client.request.tensors_size());
    info.set_pid(client.peer.pid);
    info.set_uid(client.peer.uid);
    out.push_back(info);
  }
  return out;
}

std::vector<std::shared_ptr<const executor::ReadyEvent>> Registry::ReadyEvents() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<const executor::ReadyEvent>> events;
  for (const auto& [id, client] : clients_) {
    if (client.ready_event) events.push_back(client.ready_event);
  }
  return events;
}

}  // namespace shardsync::agent
