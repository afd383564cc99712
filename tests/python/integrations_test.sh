#!/usr/bin/env bash
# Runs the integrations test with the system's Python: Debian's torch (python3-torch),
# grpcio and protobuf.
set -euo pipefail
export PYTHONPATH="client/python${PYTHONPATH:+:$PYTHONPATH}"
exec /usr/bin/python3 tests/python/integrations_test.py
