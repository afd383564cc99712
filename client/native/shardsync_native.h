// The C ABI of libshardsync_native.so: one unary gRPC call on a channel this library
// holds, request and response as serialized protobuf bytes. The Python client loads it
// (shardsync.native) so a trainer's sync() pays a C++ gRPC call, not grpcio's.
// Every entry point is thread-safe; calls may run at once on one channel.
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shardsync_channel shardsync_channel;

// A channel to `address` (host:port or unix:PATH). Plaintext when `ca_pem` is NULL;
// otherwise mutual TLS with these PEM bytes (all three given), checking `server_name`
// when not NULL instead of the dialed host. NULL on error, with the reason in `error`.
shardsync_channel* shardsync_channel_open(const char* address, const char* ca_pem, const char* cert_pem,
                                          const char* key_pem, const char* server_name, char* error, size_t error_size);

// Calls `method` ("/shardsync.v1.Coordinator/Sync") with `request` and waits up to
// `timeout_seconds`, polling for the answer for its first `poll_seconds` (0: sleeps at
// once; common/polling.h says when a wait polls). Returns the gRPC status code (0: OK).
// On OK, `*response` holds `*response_size` bytes the caller frees with shardsync_free;
// otherwise `message` holds the server's message (truncated to `message_size`).
int shardsync_unary_call(shardsync_channel* channel, const char* method, const void* request, size_t request_size,
                         double timeout_seconds, double poll_seconds, void** response, size_t* response_size,
                         char* message, size_t message_size);

void shardsync_free(void* bytes);
void shardsync_channel_close(shardsync_channel* channel);

#ifdef __cplusplus
}
#endif
