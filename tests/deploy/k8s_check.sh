#!/usr/bin/env bash
# Runs k8s_check.py with the system's Python (python3-yaml from Debian).
exec /usr/bin/python3 tests/deploy/k8s_check.py
