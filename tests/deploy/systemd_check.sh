#!/usr/bin/env bash
# The systemd units pass `systemd-analyze verify` with no complaint at all (unknown keys
# are only warnings there, so any output fails), every ${VAR} they use is set in the
# example env files, and a broken unit is caught (so the check itself works).
set -uo pipefail
here=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0

# The units as installed, pointing at the binaries built here.
cp deploy/systemd/*.service "$work/"
sed -i "s|/usr/local/bin/shardsync-agent|$here/daemon/agent/shardsync-agent|" "$work/shardsync-agent@.service"
sed -i "s|/usr/local/bin/shardsync-coordinator|$here/daemon/coordinator/shardsync-coordinator|" "$work/shardsync-coordinator.service"
sed -i "s|/usr/local/bin/shardsync-agent|$here/daemon/agent/shardsync-agent|" "$work/shardsync-single-gpu.service"
cp "$work/shardsync-agent@.service" "$work/shardsync-agent@0.service"
out=$(systemd-analyze verify "$work/shardsync-coordinator.service" "$work/shardsync-agent@0.service" \
      "$work/shardsync-single-gpu.service" 2>&1)
if [ $? -ne 0 ] || [ -n "$out" ]; then
  echo "FAIL: systemd-analyze verify complained:"; echo "$out"; fail=1
else
  echo "ok: systemd-analyze verify accepts the three units"
fi

for pair in "shardsync-coordinator.service:coordinator.env" "shardsync-agent@.service:agent-0.env" \
            "shardsync-single-gpu.service:single-gpu.env"; do
  unit=${pair%%:*}; env=${pair##*:}
  for var in $(grep -o '\${[A-Z_]*}' "deploy/systemd/$unit" | tr -d '${}' | sort -u); do
    if ! grep -q "^$var=" "deploy/systemd/$env"; then echo "FAIL: $unit uses \${$var}, $env does not set it"; fail=1; fi
  done
done
[ $fail -eq 0 ] && echo "ok: every variable the units use is in their env files"

printf '[Unit]\nDescription=broken\n[Service]\nExecStartt=/bin/true\n' > "$work/broken.service"
if [ -z "$(systemd-analyze verify "$work/broken.service" 2>&1)" ]; then
  echo "FAIL: a misspelt key went unnoticed: the check proves nothing"; fail=1
else
  echo "ok: a misspelt key is caught"
fi
exit $fail
