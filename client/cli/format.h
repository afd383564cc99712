// Human formatting shared by shardsyncctl's commands.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardsync::cli {

// 1536 -> "1.50 KiB"; below 1 KiB in bytes.
inline std::string Bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) value /= 1024, ++unit;
  return unit == 0 ? absl::StrCat(bytes, " B") : absl::StrFormat("%.2f %s", value, units[unit]);
}

}  // namespace shardsync::cli
