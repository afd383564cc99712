// The input format of agent_requests_fuzzer, shared with the program that writes its
// seeds: a byte for the world (1..4 ranks) and this agent's rank in it, then records of
// an op byte, a 2-byte little-endian length and that many bytes of the op's request.
#pragma once

#include <cstdint>
#include <string>

namespace shardsync::fuzz {

enum class AgentOp : uint8_t {
  kRegister = 0,  // RegisterRequest, from the agent's own uid (from another with bit 7)
  kWithdraw = 1,  // a client id
  kPrepare = 2,   // PrepareRequest
  kExecute = 3,   // ExecuteRequest
  kAbort = 4,     // AbortRequest
  kTransfer = 5,  // TransferRequest
  kReport = 6,    // Status, Progress and Metrics; no bytes
};
inline constexpr int kAgentOps = 7;

inline uint8_t WorldByte(int32_t world, int32_t rank) { return static_cast<uint8_t>((world - 1) | (rank << 2)); }

inline void AppendRecord(std::string* input, AgentOp op, const std::string& bytes) {
  input->push_back(static_cast<char>(op));
  input->push_back(static_cast<char>(bytes.size() & 0xff));
  input->push_back(static_cast<char>(bytes.size() >> 8));
  *input += bytes;
}

}  // namespace shardsync::fuzz
