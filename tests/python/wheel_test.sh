#!/usr/bin/env bash
# The client as a user installs it, both ways, each into a fresh virtual environment
# (Debian's pip, grpcio, protobuf and setuptools seen through --system-site-packages; no
# index), then imported from another folder with PYTHONPATH unset (wheel_test.py says
# what it checks):
#   1. scripts/build-wheel's wheel, with `pip install WHEEL`;
#   2. the folder itself, with `pip install --no-build-isolation client/python` (on a
#      copy of the tree: the build writes beside its sources).
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

mkdir -p "$tmp/tree/client" "$tmp/tree/common"
cp -rL client/python "$tmp/tree/client/"
cp -rL proto "$tmp/tree/"
cp -L common/version.h "$tmp/tree/common/"

mkdir -p "$tmp/elsewhere"
for way in wheel folder; do
  venv="$tmp/venv-$way"
  echo "== /usr/bin/python3 -m venv --without-pip --system-site-packages $venv"
  /usr/bin/python3 -m venv --without-pip --system-site-packages "$venv"
  if [ "$way" = wheel ]; then
    echo "== pip install --no-index $(basename "$wheel")"
    "$venv/bin/python" -m pip install --no-index "$wheel"
  else
    echo "== pip install --no-index --no-build-isolation client/python"
    "$venv/bin/python" -m pip install --no-index --no-build-isolation "$tmp/tree/client/python"
  fi
  echo "== checks of the $way install, from $tmp/elsewhere"
  # From stdin, so that sys.path's first entry is that empty folder, as for `python -c`.
  (cd "$tmp/elsewhere" && "$venv/bin/python" - "$venv" "$version" < "$src/tests/python/wheel_test.py")
done
