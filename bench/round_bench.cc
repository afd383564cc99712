// The cost of one NCCL round as the agent queues it, on one GPU: a communicator of one
// rank sending to itself (NCCL allows a rank to be its own peer). Per chunk size: the
// host's time to queue a round (what must stay under the device's time for rounds to
// run back to back) and the time per round with the device, over many rounds queued
// without a wait. Three ways side by side: the agent's own NcclTransport and CudaDevice
// calls (a nonblocking communicator, whose every group end NCCL launches from a new
// thread; the transport spins while it waits for the launch), the same kind of
// communicator polled with 20 us sleeps between polls, and a blocking communicator (the
// group is launched in the calling thread).
// Prints one JSON line per way and size.
//   round_bench [--rounds N] [--device N]
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/flags.h"
#include "common/status_macros.h"
#include "executor/cuda_device.h"
#include "executor/nccl_transport.h"
#include "planner/schedule.h"

namespace {

using namespace shardsync;

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "round_bench: %s\n", std::string(status.message()).c_str());
  return 1;
}

void Print(const char* way, int64_t bytes, int rounds, double host, double total) {
  std::printf(
      "{\"way\": \"%s\", \"chunk_bytes\": %lld, \"rounds\": %d, \"host_us_per_round\": %.1f, "
      "\"us_per_round\": %.1f, \"self_copy_gbps\": %.1f}\n",
      way, static_cast<long long>(bytes), rounds, host / rounds * 1e6, total / rounds * 1e6,
      bytes * rounds / total / 1e9);
  std::fflush(stdout);
}

// A one-rank communicator made with the NCCL API alone, blocking or not.
ncclComm_t RawCommunicator(bool blocking) {
  ncclUniqueId id;
  ncclGetUniqueId(&id);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = blocking ? 1 : 0;
  ncclComm_t comm = nullptr;
  ncclResult_t state = ncclCommInitRankConfig(&comm, 1, id, 0, &config);
  while (state == ncclInProgress) ncclCommGetAsyncError(comm, &state);
  return state == ncclSuccess ? comm : nullptr;
}

// Rounds of a self send/recv on `comm`; a nonblocking group's launch is awaited with
// 20 us sleeps.
bool RawRounds(ncclComm_t comm, cudaStream_t stream, uint8_t* send, uint8_t* receive, int64_t bytes, int count,
               double* host_seconds, double* total_seconds) {
  const absl::Time start = absl::Now();
  for (int r = 0; r < count; ++r) {
    ncclGroupStart();
    ncclRecv(receive, static_cast<size_t>(bytes), ncclUint8, 0, comm, stream);
    ncclSend(send, static_cast<size_t>(bytes), ncclUint8, 0, comm, stream);
    ncclResult_t state = ncclGroupEnd();
    while (state == ncclInProgress) {
      absl::SleepFor(absl::Microseconds(20));
      ncclCommGetAsyncError(comm, &state);
    }
    if (state != ncclSuccess) return false;
  }
  *host_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (cudaStreamSynchronize(stream) != cudaSuccess) return false;
  *total_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int ordinal = 0, rounds = 200;
  CLI::App app("Rounds of the NCCL transport on one device (a rank sending to itself).", "round_bench");
  flags::AddInt(app, "--device", ordinal, "CUDA device ordinal", 0);
  flags::AddInt(app, "--rounds", rounds, "rounds to time", 1);
  if (const int code = flags::Parse(app, argc, argv); code >= 0) return code;
  auto device = executor::CudaDevice::Open(ordinal);
  if (!device.ok()) return Fail(device.status());
  executor::NcclTransport transport(ordinal, (*device)->network_stream());
  auto id = transport.NewCommunicatorId();
  if (!id.ok()) return Fail(id.status());
  executor::PeerSetup setup;
  setup.rank = 0;
  setup.world_size = 1;
  setup.communicator_id = *id;
  setup.generation = 1;
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  if (auto status = transport.Setup(setup, deadline); !status.ok()) return Fail(status);

  const std::vector<int64_t> sizes = {int64_t{1} << 20, int64_t{8} << 20, int64_t{32} << 20, int64_t{128} << 20};
  uint8_t* send = nullptr;
  uint8_t* receive = nullptr;
  if (cudaMalloc(&send, sizes.back()) != cudaSuccess || cudaMalloc(&receive, sizes.back()) != cudaSuccess) {
    return Fail(absl::ResourceExhaustedError("cudaMalloc failed"));
  }
  cudaMemset(send, 0x5A, sizes.back());
  for (int64_t bytes : sizes) {
    const auto run = [&](int count, double* host_seconds) -> absl::Status {
      const absl::Time start = absl::Now();
      for (int r = 0; r < count; ++r) {
        const int slot = r % planner::kStagingSlots;
        SHARDSYNC_RETURN_IF_ERROR((*device)->BeforeTransfer(slot));
        const executor::SendOp out{0, send, bytes};
        const executor::RecvOp in{0, receive, bytes};
        SHARDSYNC_RETURN_IF_ERROR(transport.RunRound("bench", r, {&out, 1}, {&in, 1}, deadline));
        SHARDSYNC_RETURN_IF_ERROR((*device)->AfterTransfer(slot));
      }
      *host_seconds = absl::ToDoubleSeconds(absl::Now() - start);
      return transport.Finish(deadline);
    };
    double host = 0;
    if (auto s = run(10, &host); !s.ok()) return Fail(s);  // warm-up
    const absl::Time start = absl::Now();
    if (auto s = run(rounds, &host); !s.ok()) return Fail(s);
    Print("agent transport (nonblocking, spins for the launch)", bytes, rounds, host,
          absl::ToDoubleSeconds(absl::Now() - start));
  }
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  for (bool blocking : {false, true}) {
    ncclComm_t comm = RawCommunicator(blocking);
    if (comm == nullptr) return Fail(absl::InternalError("a raw NCCL communicator failed"));
    for (int64_t bytes : sizes) {
      double host = 0, total = 0;
      if (!RawRounds(comm, stream, send, receive, bytes, 10, &host, &total) ||
          !RawRounds(comm, stream, send, receive, bytes, rounds, &host, &total)) {
        return Fail(absl::InternalError("raw NCCL rounds failed"));
      }
      Print(blocking ? "blocking communicator" : "nonblocking, 20 us sleeps", bytes, rounds, host, total);
    }
    ncclCommDestroy(comm);
  }
  cudaStreamDestroy(stream);
  cudaFree(send);
  cudaFree(receive);
  return 0;
}
