// Target versions: the sync whose bytes a rank's targets hold. The coordinator's own
// syncs set them, a sync that may have written part of a rank clears its, and for a
// rank no sync of this coordinator wrote since it published, its agent's word counts.
#include "daemon/coordinator/target_validity.h"

#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <string>

namespace shardsync::coordinator {
namespace {

TEST_CASE("a rank's targets hold the version of the last sync that wrote them whole, or its agent's word") {
  TargetValidity validity;
  // A coordinator that just started: only the agents' words (rank 2 says invalid).
  const std::map<int32_t, std::string> words{{0, "sync-a"}, {1, "sync-a"}, {2, ""}};
  CHECK(validity.Versions(words) == std::map<int32_t, std::string>{{0, "sync-a"}, {1, "sync-a"}});
  CHECK(validity.Invalid(words) == std::set<int32_t>{2});  // a rank is invalid exactly when it has no version
  validity.Written({0, 1, 2}, true, "sync-b");
  CHECK(validity.Versions(words) == std::map<int32_t, std::string>{{0, "sync-b"}, {1, "sync-b"}, {2, "sync-b"}});
  // A failed sync may have written part of rank 1; a partial one rewrites rank 2 only.
  validity.PartlyWritten({1});
  validity.Written({2}, false, "sync-c");
  CHECK(validity.Versions(words) == std::map<int32_t, std::string>{{0, "sync-b"}, {2, "sync-c"}});
  CHECK(validity.Invalid(words) == std::set<int32_t>{1});
  // Rank 0 published again (a new registration there): its agent's word counts again.
  validity.Republished(0);
  CHECK(validity.Versions({{0, ""}, {1, "sync-a"}, {2, ""}}) == std::map<int32_t, std::string>{{2, "sync-c"}});
  // Rank 1's agent restarted: its new targets hold nothing until a sync writes them.
  validity.Restarted(1);
  CHECK(validity.Versions({{1, ""}}).empty());
  validity.Written({0, 1, 2}, true, "sync-d");
  CHECK(validity.Versions({{0, ""}, {1, ""}, {2, ""}}) ==
        std::map<int32_t, std::string>{{0, "sync-d"}, {1, "sync-d"}, {2, "sync-d"}});
}

TEST_CASE("a rank without a version says why: a new agent, a new publication, or a sync that failed part way") {
  TargetValidity validity;
  // A coordinator that just started: rank 2's agent says its targets are invalid.
  const std::map<int32_t, std::string> words{{0, "sync-a"}, {1, ""}, {2, ""}};
  validity.Republished(1);
  CHECK(validity.Unversioned(words) == std::map<int32_t, std::string>{{1, "new_target"}, {2, "invalid_target"}});
  validity.Written({0, 1, 2}, true, "sync-b");
  CHECK(validity.Unversioned(words).empty());
  validity.PartlyWritten({0, 1, 2});
  CHECK(validity.Unversioned(words) ==
        std::map<int32_t, std::string>{{0, "invalid_target"}, {1, "invalid_target"}, {2, "invalid_target"}});
  // Rank 1's agent restarted and registered again: a new process, whatever came before.
  validity.Restarted(1);
  validity.Republished(1);
  CHECK(validity.Unversioned(words).at(1) == "restarted_agent");
  validity.Written({1}, false, "sync-c");
  CHECK(validity.Unversioned(words) == std::map<int32_t, std::string>{{0, "invalid_target"}, {2, "invalid_target"}});
  // A later publication on rank 1 (new buffers there) holds nothing yet.
  validity.Republished(1);
  CHECK(validity.Unversioned({{1, ""}}) == std::map<int32_t, std::string>{{1, "new_target"}});
}

}  // namespace
}  // namespace shardsync::coordinator
