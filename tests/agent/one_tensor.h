// Registrations of one float32 tensor "w" [16, 24] for agent tests: a trainer's ZeRO-3
// partition of it and a rollout's whole copy, in heap buffers (tests/agent/heap_backend.h),
// and a coordinator link that is never started (the test plays the coordinator).
#pragma once

#include <cstdint>
#include <string>

#include "daemon/agent/coordinator_link.h"
#include "proto/shardsync.pb.h"

namespace shardsync::agent {

inline constexpr int64_t kRows = 16, kCols = 24, kElements = kRows * kCols;

// `client`'s registration of one buffer and of tensor "w" in it, its layout left empty.
inline v1::RegisterRequest OneTensorRegistration(const std::string& client, v1::Role role, const std::string& buffer,
                                                 int64_t bytes) {
  v1::RegisterRequest request;
  request.set_client_id(client);
  request.set_role(role);
  v1::RegisteredBuffer* registered = request.add_buffers();
  registered->set_name(buffer);
  registered->set_bytes(bytes);
  registered->mutable_handle()->set_shm_name("heap");
  v1::TensorLayout* tensor = request.add_tensors();
  tensor->set_name("w");
  tensor->add_shape(kRows);
  tensor->add_shape(kCols);
  tensor->set_dtype(v1::FLOAT32);
  return request;
}

// Client "trainer": rank `rank`'s ZeRO-3 partition of "w" over `world` ranks, buffer "flat".
inline v1::RegisterRequest ZeroThreeTrainer(int32_t rank, int32_t world) {
  const int64_t part = kElements / world;
  v1::RegisterRequest request = OneTensorRegistration("trainer", v1::SOURCE, "flat", part * 4);
  v1::FlatPlacement* flat = request.mutable_tensors(0)->add_flat_placements();
  flat->set_rank(rank);
  flat->set_buffer("flat");
  flat->set_begin(rank * part);
  flat->set_end((rank + 1) * part);
  return request;
}

// Client "rollout": the whole of "w" on rank `rank`, buffer "arena".
inline v1::RegisterRequest WholeRollout(int32_t rank) {
  v1::RegisterRequest request = OneTensorRegistration("rollout", v1::TARGET, "arena", kElements * 4);
  v1::Placement* whole = request.mutable_tensors(0)->add_placements();
  whole->set_rank(rank);
  whole->set_buffer("arena");
  for (int64_t extent : {kRows, kCols}) {
    whole->mutable_box()->add_lo(0);
    whole->mutable_box()->add_hi(extent);
  }
  return request;
}

// A coordinator link to nowhere, for an agent whose test is its coordinator.
inline LinkConfig UnusedLink() {
  LinkConfig config;
  config.coordinator = "127.0.0.1:1";
  config.credentials.channel = grpc::InsecureChannelCredentials();
  config.credentials.insecure = true;
  return config;
}

}  // namespace shardsync::agent
