#!/usr/bin/env bash
# The benchmark's models.pieces against brute force, with the system's Python.
set -euo pipefail
export PYTHONPATH="client/python:bench/sync${PYTHONPATH:+:$PYTHONPATH}"
exec /usr/bin/python3 tests/python/bench_pieces_test.py
