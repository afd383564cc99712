// The largest answer a client takes from a daemon (Explain and Status answers of a
// large world; gRPC's own default takes 4 MiB), and the largest message the C++
// client sends (a large model's layouts). The C++ client, the native library and the
// Python client (client.py) bound answers so.
#pragma once

namespace shardsync {

inline constexpr int kClientMessageBytes = 64 << 20;

}  // namespace shardsync
