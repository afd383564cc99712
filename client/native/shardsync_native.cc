#include "client/native/shardsync_native.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/client_messages.h"
#include "common/grpc_polling.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

struct shardsync_channel {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<grpc::GenericStub> stub;
};

namespace {

void CopyMessage(const std::string& text, char* out, size_t size) {
  if (out == nullptr || size == 0) return;
  const size_t n = text.size() < size - 1 ? text.size() : size - 1;
  std::memcpy(out, text.data(), n);
  out[n] = '\0';
}

}  // namespace

extern "C" shardsync_channel* shardsync_channel_open(const char* address, const char* ca_pem, const char* cert_pem,
                                                     const char* key_pem, const char* server_name, char* error,
                                                     size_t error_size) {
  if (address == nullptr || *address == '\0') {
    CopyMessage("no address given", error, error_size);
    return nullptr;
  }
  const bool tls = ca_pem != nullptr;
  if (tls != (cert_pem != nullptr) || tls != (key_pem != nullptr)) {
    CopyMessage("TLS needs the CA, the certificate and the key, all three", error, error_size);
    return nullptr;
  }
  // The credentials of common/tls.h (MakeChannel), built here from PEM bytes: that
  // library links gRPC statically in the portable build, which a shared object cannot.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(shardsync::kClientMessageBytes);
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (tls) {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = ca_pem;
    options.pem_cert_chain = cert_pem;
    options.pem_private_key = key_pem;
    credentials = grpc::SslCredentials(options);
    if (server_name != nullptr) args.SetSslTargetNameOverride(server_name);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  auto channel = grpc::CreateCustomChannel(address, credentials, args);
  return new shardsync_channel{channel, std::make_unique<grpc::GenericStub>(channel)};
}

extern "C" int shardsync_unary_call(shardsync_channel* channel, const char* method, const void* request,
                                    size_t request_size, double timeout_seconds, double poll_seconds, void** response,
                                    size_t* response_size, char* message, size_t message_size) {
  const auto deadline =
      std::chrono::system_clock::now() +
      std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double>(timeout_seconds));
  const auto poll_for =
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(poll_seconds));
  grpc::Slice slice(request, request_size);
  grpc::ByteBuffer request_buffer(&slice, 1);
  grpc::ByteBuffer response_buffer;
  // The calling thread waits on its own queue, polling it first: no other thread is
  // woken for the answer, and this one is awake when it comes.
  const grpc::Status status = shardsync::UnaryCall(
      deadline,
      [&](grpc::ClientContext* context, grpc::CompletionQueue* queue) {
        return channel->stub->PrepareUnaryCall(context, method, request_buffer, queue);
      },
      &response_buffer, poll_for);
  if (!status.ok()) {
    CopyMessage(status.error_message(), message, message_size);
    return status.error_code();
  }
  std::vector<grpc::Slice> slices;
  if (!response_buffer.Dump(&slices).ok()) {
    CopyMessage("the answer could not be read", message, message_size);
    return grpc::StatusCode::INTERNAL;
  }
  size_t size = 0;
  for (const auto& s : slices) size += s.size();
  auto* bytes = static_cast<unsigned char*>(std::malloc(size == 0 ? 1 : size));
  if (bytes == nullptr) {
    CopyMessage("no memory for the answer", message, message_size);
    return grpc::StatusCode::RESOURCE_EXHAUSTED;
  }
  size_t at = 0;
  for (const auto& s : slices) {
    std::memcpy(bytes + at, s.begin(), s.size());
    at += s.size();
  }
  *response = bytes;
  *response_size = size;
  return 0;
}

extern "C" void shardsync_free(void* bytes) { std::free(bytes); }

extern "C" void shardsync_channel_close(shardsync_channel* channel) { delete channel; }
