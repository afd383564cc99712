#!/usr/bin/env bash
# Runs the Python client test with the system's Python, which has Debian's grpcio and
# protobuf (python3-grpcio, python3-protobuf).
set -euo pipefail
export PYTHONPATH="client/python${PYTHONPATH:+:$PYTHONPATH}"
exec /usr/bin/python3 tests/python/python_client_test.py
