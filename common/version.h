// The release every binary reports (shardsyncctl version, the daemons' logs).
#pragma once

namespace shardsync {

inline constexpr char kVersion[] = "0.1.0";

}  // namespace shardsync
