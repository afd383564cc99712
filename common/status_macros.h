// Early returns of a failed status, in functions (and lambdas) that return absl::Status or
// absl::StatusOr<T>. The status is passed through unchanged; to wrap or rename an error,
// write the `if` by hand.
//
// SHARDSYNC_RETURN_IF_ERROR(expr): `expr` is an absl::Status (a StatusOr does not compile:
//   use SHARDSYNC_ASSIGN_OR_RETURN). Returns it when not ok. One statement.
//
// SHARDSYNC_ASSIGN_OR_RETURN(lhs, expr): `expr` is an absl::StatusOr<T>, evaluated once into
//   a temporary named after the line. Returns its status when not ok, else does
//   `lhs = *std::move(temporary);`. `lhs` declares (`auto x`, `const planner::Plan plan`) or
//   names an existing variable. Several statements: not the body of an unbraced if or loop,
//   and at most one per line.
//
// A comma outside parentheses (a braced list, template arguments) splits a macro argument:
// put such an `expr` in parentheses; `lhs` must have none.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SHARDSYNC_RETURN_IF_ERROR(expr)                                     \
  do {                                                                      \
    if (absl::Status shardsync_status_ = (expr); !shardsync_status_.ok()) { \
      return shardsync_status_;                                             \
    }                                                                       \
  } while (false)

#define SHARDSYNC_ASSIGN_OR_RETURN(lhs, expr) \
  SHARDSYNC_ASSIGN_OR_RETURN_IMPL_(SHARDSYNC_STATUS_CONCAT_(shardsync_statusor_, __LINE__), lhs, expr)

// Implementation: __LINE__ is expanded before it is pasted, hence two levels.
#define SHARDSYNC_STATUS_CONCAT_INNER_(x, y) x##y
#define SHARDSYNC_STATUS_CONCAT_(x, y) SHARDSYNC_STATUS_CONCAT_INNER_(x, y)
#define SHARDSYNC_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                     \
  if (!statusor.ok()) {                                       \
    return statusor.status();                                 \
  }                                                           \
  lhs = *std::move(statusor)
