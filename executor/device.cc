#include "executor/device.h"

#include "absl/strings/str_cat.h"

namespace shardsync::executor {

absl::StatusOr<std::shared_ptr<const ReadyEvent>> Device::OpenReadyEvent(const std::string&) {
  return absl::InvalidArgumentError(
      absl::StrCat("a ready event needs a CUDA agent (--device N); this one runs on ", name()));
}

absl::Status Device::WaitFor(absl::Span<const std::shared_ptr<const ReadyEvent>> events) {
  if (events.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("device ", name(), " holds ready events it cannot wait for"));
}

}  // namespace shardsync::executor
