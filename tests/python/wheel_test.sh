#!/usr/bin/env bash
# scripts/build-wheel's wheel as a user gets it: built into this test's temporary folder,
# installed with pip (no index: grpcio and protobuf are Debian's, seen through
# --system-site-packages) into a fresh virtual environment, then imported from another
# folder with PYTHONPATH unset (wheel_test.py says what it checks).
set -euo pipefail
tmp=${TEST_TMPDIR:-$(mktemp -d)}
src=$PWD
unset PYTHONPATH PIP_FIND_LINKS PIP_INDEX_URL PIP_EXTRA_INDEX_URL
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1

version=$(sed -n 's/^inline constexpr char kVersion\[\] = "\(.*\)";$/\1/p' common/version.h)
echo "== scripts/build-wheel $tmp/dist (common/version.h: $version)"
scripts/build-wheel "$tmp/dist"
wheel="$tmp/dist/shardsync-$version-py3-none-any.whl"
[ -f "$wheel" ] || { echo "FAIL: no $wheel" >&2; ls -l "$tmp/dist" >&2; exit 1; }
ls -l "$tmp/dist"

echo "== /usr/bin/python3 -m venv --system-site-packages $tmp/venv"
/usr/bin/python3 -m venv --system-site-packages "$tmp/venv"
echo "== pip install --no-index $(basename "$wheel")"
"$tmp/venv/bin/python" -m pip install --no-index "$wheel"

mkdir -p "$tmp/elsewhere"
cd "$tmp/elsewhere"
echo "== checks, from $PWD"
# From stdin, so that sys.path's first entry is this empty folder, as for `python -c`.
"$tmp/venv/bin/python" - "$tmp/venv" "$version" < "$src/tests/python/wheel_test.py"
