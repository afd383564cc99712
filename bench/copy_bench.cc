// Local copies on one GPU, three ways side by side: the copy kernel as a sync runs them
// (CudaDevice::CopyLocal), the copy engine (one cudaMemcpy2DAsync per segment that is
// 1-D or 2-D with contiguous rows) and one flat cudaMemcpyAsync of the same bytes (the
// memory's own speed). Cases: rank 0's local segments of Qwen3 layouts, as the planner
// makes them. Prints one JSON line per case.
//   copy_bench [--device N] [--repeats N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "common/flags.h"
#include "executor/cuda_device.h"
#include "planner/known_models.h"
#include "planner/model_layout.h"
#include "planner/plan.h"
#include "planner/schedule.h"

namespace {

using namespace shardsync;

#define CHECK_CUDA(call)                                                  \
  do {                                                                    \
    const cudaError_t error = (call);                                     \
    if (error != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(error)); \
      std::exit(1);                                                       \
    }                                                                     \
  } while (0)

planner::PlanInput Qwen(const char* model, int zero, std::vector<std::vector<int32_t>> replicas) {
  planner::ModelLayoutSpec spec = planner::Qwen3Layout(*planner::FindDenseModel(model), /*fused=*/false);
  spec.zero_stage = zero;
  spec.dp_ranks = {0, 1};
  spec.replicas = std::move(replicas);
  return *planner::ExpandModel(spec);
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Seconds of `enqueue` on `stream`, between two events; the median of `repeats`.
double Timed(cudaStream_t stream, int repeats, const std::function<void()>& enqueue) {
  cudaEvent_t start, end;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&end));
  std::vector<double> seconds;
  for (int i = 0; i <= repeats; ++i) {  // the first is a warm-up
    CHECK_CUDA(cudaEventRecord(start, stream));
    enqueue();
    CHECK_CUDA(cudaEventRecord(end, stream));
    CHECK_CUDA(cudaEventSynchronize(end));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, end));
    if (i > 0) seconds.push_back(ms / 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  return Median(seconds);
}

void RunCase(const std::string& name, const planner::PlanInput& input, int ordinal, int repeats) {
  auto plan = planner::MakePlan(input, *planner::LocalFirstLeastLoaded());
  auto schedules = plan.ok() ? planner::MakeSchedules(*plan, int64_t{64} << 20) : plan.status();
  if (!schedules.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), std::string(schedules.status().message()).c_str());
    std::exit(1);
  }
  const planner::Schedule& schedule = (*schedules)[0];
  executor::BufferTable table;
  std::vector<void*> allocations;
  for (const planner::Buffer& b : input.buffers) {
    if (b.holder.rank != 0) continue;
    if (static_cast<int32_t>(table.size()) <= b.holder.buffer) table.resize(b.holder.buffer + 1, nullptr);
    void* memory = nullptr;
    CHECK_CUDA(cudaMalloc(&memory, std::max<int64_t>(b.bytes, 1)));
    CHECK_CUDA(cudaMemset(memory, 0x3c, b.bytes));
    table[b.holder.buffer] = static_cast<uint8_t*>(memory);
    allocations.push_back(memory);
  }
  int64_t bytes = 0, engine_bytes = 0;
  for (int32_t index : schedule.stages[0].local_segments) bytes += planner::SegmentBytes(plan->segments[index]);

  auto device = executor::CudaDevice::Open(ordinal);
  if (!device.ok()) std::exit(1);
  std::vector<double> kernel;
  for (int i = 0; i <= repeats; ++i) {
    if (!(*device)->CopyLocal(*plan, schedule.stages[0].local_segments, {}, table).ok() ||
        !(*device)->Synchronize().ok()) {
      std::exit(1);
    }
    if (i > 0) kernel.push_back(*(*device)->TakeLocalSeconds());
  }

  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<const planner::Segment*> engine_segments;
  for (int32_t index : schedule.stages[0].local_segments) {
    const planner::Segment& s = plan->segments[index];
    const int last = s.axes - 1;
    if (s.src_dtype == s.dst_dtype && s.axes <= 2 && s.src_strides[last] == 1 && s.dst_strides[last] == 1) {
      engine_segments.push_back(&s);
      engine_bytes += planner::SegmentBytes(s);
    }
  }
  const double engine = Timed(stream, repeats, [&] {
    for (const planner::Segment* s : engine_segments) {
      const int64_t element = planner::ElementBytes(s->dst_dtype);
      const uint8_t* src = table[s->src.buffer] + s->src_base * element;
      uint8_t* dst = table[s->dst.buffer] + s->dst_base * element;
      if (s->axes == 1) {
        CHECK_CUDA(cudaMemcpyAsync(dst, src, s->shape[0] * element, cudaMemcpyDeviceToDevice, stream));
      } else {
        CHECK_CUDA(cudaMemcpy2DAsync(dst, s->dst_strides[0] * element, src, s->src_strides[0] * element,
                                     s->shape[1] * element, s->shape[0], cudaMemcpyDeviceToDevice, stream));
      }
    }
  });
  void* flat_src = nullptr;
  void* flat_dst = nullptr;
  CHECK_CUDA(cudaMalloc(&flat_src, bytes));
  CHECK_CUDA(cudaMalloc(&flat_dst, bytes));
  const double flat = Timed(stream, repeats, [&] {
    CHECK_CUDA(cudaMemcpyAsync(flat_dst, flat_src, bytes, cudaMemcpyDeviceToDevice, stream));
  });
  const double kernel_seconds = Median(kernel);
  std::printf(
      "{\"case\": \"%s\", \"segments\": %zu, \"local_bytes\": %lld, \"kernel_ms\": %.3f, \"kernel_gbps\": %.0f, "
      "\"engine_segments\": %zu, \"engine_bytes\": %lld, \"engine_ms\": %.3f, \"engine_gbps\": %.0f, "
      "\"flat_ms\": %.3f, \"flat_gbps\": %.0f}\n",
      name.c_str(), schedule.stages[0].local_segments.size(), static_cast<long long>(bytes), kernel_seconds * 1e3,
      2 * bytes / kernel_seconds / 1e9, engine_segments.size(), static_cast<long long>(engine_bytes), engine * 1e3,
      2 * engine_bytes / engine / 1e9, flat * 1e3, 2 * bytes / flat / 1e9);
  std::fflush(stdout);
  cudaFree(flat_src);
  cudaFree(flat_dst);
  for (void* memory : allocations) cudaFree(memory);
  cudaStreamDestroy(stream);
}

}  // namespace

int main(int argc, char** argv) {
  int ordinal = 0, repeats = 10;
  CLI::App app("Local copies of a rank's segments on one device, against the memory floor.", "copy_bench");
  flags::AddInt(app, "--device", ordinal, "CUDA device ordinal", 0);
  flags::AddInt(app, "--repeats", repeats, "timed repeats of each case", 1);
  if (const int code = flags::Parse(app, argc, argv); code >= 0) return code;
  // GB/s count read + write, as the floor's memory speed does.
  RunCase("qwen3-8b zero3x2 -> tp2, rank 0", Qwen("qwen3-8b", 3, {{0, 1}}), ordinal, repeats);
  RunCase("qwen3-8b zero3x2 -> tp1x2, rank 0", Qwen("qwen3-8b", 3, {{0}, {1}}), ordinal, repeats);
  RunCase("qwen3-8b zero1x2 -> tp2, rank 0", Qwen("qwen3-8b", 1, {{0, 1}}), ordinal, repeats);
  RunCase("qwen3-1.7b zero3x2 -> tp2, rank 0", Qwen("qwen3-1.7b", 3, {{0, 1}}), ordinal, repeats);
  return 0;
}
