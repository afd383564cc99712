#!/usr/bin/env bash
# Run by scripts/test (outside Bazel: it reads the whole tree). The docs name only flags
# and symbols the code has and link only to headings that exist (doc_names_check.py),
# and the check can fail: a copy of the docs that breaks each rule is refused.
set -euo pipefail
python3 tests/docs/doc_names_check.py .
tmp=${TEST_TMPDIR:-$(mktemp -d)}
mkdir -p "$tmp/tree/docs"
cp -rL README.md "$tmp/tree/"
cp -rL docs/*.md "$tmp/tree/docs/"
for d in bench client common daemon deploy examples executor planner proto scripts spec tests third_party tools .ci; do ln -s "$PWD/$d" "$tmp/tree/$d"; done
echo 'Run `shardsync-agent --no-such-flag`, read `NoSuchLedger::Entry` and [this](benchmarks.md#no-such-heading).' \
  >> "$tmp/tree/docs/operations.md"
if out=$(python3 tests/docs/doc_names_check.py "$tmp/tree"); then
  echo "FAIL: the check passed docs that name a flag and a symbol nobody has" >&2
  exit 1
fi
echo "$out" | grep -q "flag --no-such-flag is in no code"
echo "$out" | grep -q "symbol NoSuchLedger::Entry is in no code"
echo "$out" | grep -q "link benchmarks.md#no-such-heading reaches no heading"
echo "the check refuses a doc that names a missing flag or symbol, or links to no heading"
