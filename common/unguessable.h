// Unguessable tokens: 128 bits from the kernel's random source, in hex.
#pragma once

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/string_view.h"

namespace shardsync {

// Aborts the process, saying why, if the kernel gives no randomness: nothing may go on
// with a guessable credential.
inline std::string UnguessableHex() {
  uint8_t bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno != EINTR) {
      std::fprintf(stderr, "getrandom failed: %s; no unguessable token can be made\n", std::strerror(errno));
      std::abort();
    }
    if (n > 0) got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

}  // namespace shardsync
