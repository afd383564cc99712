#!/usr/bin/env bash
# Runs the vLLM stand-in's self-test with the system's Python (Debian's torch).
set -euo pipefail
exec /usr/bin/python3 tests/python/standins/vllm_qwen3_selftest.py
