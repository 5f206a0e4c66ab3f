#!/usr/bin/env bash
# The benchmark command: a regular (not editable) install of slurmlaunch with torch 2.13.0 (CPU),
# submitit and python-hostlist in .bench-venv, then every comparison in one run.
# Usage: bash benchmarks/run.sh [--quick] [--json results.json]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .bench-venv
.bench-venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 numpy submitit python-hostlist .
export PATH="$PWD/.bench-venv/bin:$PATH"
cd .bench-venv  # not the source tree: the installed package is what gets measured
exec python ../benchmarks/run.py "$@"
