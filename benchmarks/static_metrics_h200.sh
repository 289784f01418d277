#!/usr/bin/env bash
# Static metrics on a GPU node: ahead-of-time for the node's GPU plus the runtime-compiled check.
# Usage: bash benchmarks/static_metrics_h200.sh OUTDIR
set -euo pipefail
out="${1:-static-metrics-out}"
cd "$(dirname "$0")/.."
unset TRITON_INTERPRET
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" benchmarks/static_metrics_h200.py "$out"
