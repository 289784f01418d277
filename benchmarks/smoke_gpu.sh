#!/usr/bin/env bash
# GPU smoke of kernelab as a user installs it: the project wheel and its dependencies from .whl/
# (`pip wheel --no-deps -w .whl .` plus ../shared/tools/gpu-wheelhouse) installed into /tmp/site,
# then, outside the checkout, `kernelab run` of the GPU demo (the job path: fork server, measuring
# child, probes) and `kernelab up --exit` (server, compare worker, runner daemon, the demo through
# HTTP). Writes the outputs to $OUT (default /tmp/smoke) and prints a short table last.
# Usage, on the GPU node from the repository root: bash benchmarks/smoke_gpu.sh
set -uo pipefail
REPO=$PWD
OUT=${OUT:-/tmp/smoke}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
cd /tmp || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.txt"
python3 -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, torch.version.cuda, triton.__version__)' | tee -a "$OUT/env.txt"
rows=()
t0=$(date +%s.%N)
python3 -m kernelab run "$REPO/examples/softmax.yaml" > "$OUT/run.txt" 2>&1
rc_run=$?
t1=$(date +%s.%N)
python3 -m kernelab up --exit --data-dir /tmp/smoke-data --port 8123 > "$OUT/up.txt" 2>&1
rc_up=$?
t2=$(date +%s.%N)
echo "--- run (last 25 lines)"; tail -n 25 "$OUT/run.txt"
echo "--- up (last 30 lines)"; tail -n 30 "$OUT/up.txt"
printf '\n%-28s %6s %8s\n' command rc wall_s
printf '%-28s %6s %8.1f\n' "kernelab run softmax.yaml" "$rc_run" "$(python3 -c "print($t1 - $t0)")"
printf '%-28s %6s %8.1f\n' "kernelab up --exit" "$rc_up" "$(python3 -c "print($t2 - $t1)")"
