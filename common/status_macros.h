// The one status helper: returns a failed absl::Status (or StatusOr's status) at once.
#pragma once

#include "absl/status/status.h"

#define SHARDSYNC_RETURN_IF_ERROR(expression)              \
  do {                                                     \
    if (absl::Status shardsync_status_ = (expression);     \
        !shardsync_status_.ok()) {                         \
      return shardsync_status_;                            \
    }                                                      \
  } while (false)
