// File descriptors between processes of one host, on a unix SOCK_SEQPACKET socket
// (SCM_RIGHTS): the wire of an agent's descriptor socket, shared by the agent that
// serves it, the peer agents that fetch from it and the C++ client that puts there.
// One message a request, one answer:
//   put    "P" carrying 1..kMaxDescriptors descriptors -> "T<token>"
//   fetch  "F<token>"                                  -> "D" carrying the descriptors
// and "E<error>" for a refusal.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"

namespace shardsync {

inline constexpr int kMaxDescriptors = 64;   // in one message
inline constexpr size_t kMaxMessage = 1024;  // bytes of a message, its descriptors aside

// The descriptor socket of the agent whose unix socket is `socket_path`.
std::string DescriptorSocketPath(const std::string& socket_path);

// One message and the descriptors it carries (they stay the caller's); with
// MSG_DONTWAIT in `flags`, fails rather than wait for room.
absl::Status SendMessage(int socket, const std::string& payload, const std::vector<int>& descriptors, int flags);
// One message, never waiting: false when none waits (a wakeup with nothing to read),
// else true, with an empty payload and no descriptors when the other end closed. The
// descriptors it carried become the caller's (also when it is refused: too many
// descriptors or bytes).
absl::StatusOr<bool> ReceiveMessage(int socket, std::string* payload, std::vector<UniqueFd>* descriptors);

// A connection to the descriptor socket at `path`.
absl::StatusOr<UniqueFd> ConnectDescriptorSocket(const std::string& path);
// A put on `connection`: the token the agent answered. The descriptors wait there for
// the registration naming the token while `connection` stays open.
absl::StatusOr<std::string> PutDescriptors(int connection, const std::vector<int>& descriptors, absl::Time deadline);
// A fetch from the descriptor socket at `path`: the descriptors of `token`.
absl::StatusOr<std::vector<UniqueFd>> FetchDescriptors(const std::string& path, const std::string& token,
                                                       absl::Time deadline);

}  // namespace shardsync
