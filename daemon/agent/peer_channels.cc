#include "daemon/agent/peer_channels.h"

namespace shardsync::agent {

std::shared_ptr<v1::AgentControl::Stub> PeerChannels::Stub(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<v1::AgentControl::Stub>& stub = stubs_[address];
  if (stub == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);  // a Transfer carries a whole chunk
    stub = v1::AgentControl::NewStub(MakeChannel(address, credentials_, args));
  }
  return stub;
}

void PeerChannels::Drop() {
  absl::MutexLock lock(&mu_);
  stubs_.clear();
}

}  // namespace shardsync::agent
