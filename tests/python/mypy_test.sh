#!/usr/bin/env bash
# The client package's public API is typed: mypy (Debian's) with client/python's
# pyproject.toml settings (every function annotated) passes on the package as Bazel
# builds it (the generated message modules beside it).
set -euo pipefail
cd client/python
mypy --config-file pyproject.toml --cache-dir "${TEST_TMPDIR:-$(mktemp -d)}/mypy" -p shardsync
