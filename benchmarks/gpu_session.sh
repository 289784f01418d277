#!/usr/bin/env bash
# The GPU-node check of the main job, as run on the lent H200 (see docs/results/).
# Usage (repo root, on the GPU node, wheels for the server packages in .whl/):
#   bash benchmarks/gpu_session.sh OUTDIR [main|timing|batch1|batch2]
# main:   GPU tests, `kernelab probe`, `kernelab up` with both examples (server + runner + job over
#         real HTTP on SQLite), the plausibility guard.
# timing: benchmarks/timing_accuracy.py verdicts and methods parts.
# batch1: (2 GPUs) timing on GPU 0 then the revision A/B job; the correctness sweep on GPU 1 and the
#         static metrics (compile only) at the same time.
# batch2: (2 GPUs) probe accuracy + contention drill, GPU unit tests, the guard.
set -uo pipefail
out=${1:?usage: gpu_session.sh OUTDIR [main|timing]}; part=${2:-main}
mkdir -p "$out"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
K="python3 -m kernelab.runners.cli"
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
if [ "$part" = main ]; then
  step environment
  { nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
    python3 -c 'import torch, triton, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, triton.__version__)'; } | tee "$out/env.txt"
  step gpu tests
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels tests/runners 2>&1 | tail -15 | tee "$out/pytest_gpu.txt"
  step kernelab probe
  timeout 120 $K probe --json "$out/probe.json" 2>&1 | tee "$out/probe.txt"
  step kernelab up softmax
  timeout 300 $K up --exit --port 8765 --data-dir /tmp/kl --spec examples/softmax.yaml 2>&1 | tee "$out/up_softmax.txt"
  step kernelab up matmul
  timeout 300 $K up --exit --port 8765 --data-dir /tmp/kl --spec examples/matmul.yaml 2>&1 | tee "$out/up_matmul.txt"
  cp /tmp/kl/kernelab.db "$out/h200.db" 2>/dev/null
  step guard
  timeout 120 python3 benchmarks/timing_accuracy.py --out "$out" --part guard 2>&1 | tail -3 | tee "$out/guard.txt"
elif [ "$part" = batch1 ]; then
  step batch1
  ( CUDA_VISIBLE_DEVICES=1 timeout 400 python3 benchmarks/correctness_sweep.py "$out/correctness" > "$out/correctness.txt" 2>&1 ) &
  ( CUDA_VISIBLE_DEVICES=1 timeout 300 bash benchmarks/static_metrics_h200.sh "$out/static" > "$out/static.txt" 2>&1 ) &
  export CUDA_VISIBLE_DEVICES=0
  timeout 240 python3 benchmarks/timing_accuracy.py --out "$out/timing" --part verdicts --runs 20 > "$out/verdicts.txt" 2>&1
  timeout 200 python3 benchmarks/timing_accuracy.py --out "$out/timing" --part methods --processes 10 > "$out/methods.txt" 2>&1
  wait
  timeout 120 python3 benchmarks/revisions_h200.py "$out/revisions" > "$out/revisions.txt" 2>&1
  for f in verdicts methods correctness static revisions; do echo "=== $f"; tail -40 "$out/$f.txt"; done
elif [ "$part" = batch2 ]; then
  step batch2
  timeout 300 python3 benchmarks/probe_accuracy.py "$out/probe" > "$out/probe_accuracy.txt" 2>&1
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels tests/runners > "$out/pytest_gpu.txt" 2>&1
  timeout 120 python3 benchmarks/timing_accuracy.py --out "$out" --part guard > "$out/guard.txt" 2>&1
  for f in probe_accuracy pytest_gpu guard; do echo "=== $f"; tail -40 "$out/$f.txt"; done
elif [ "$part" = probes ]; then
  # (2 GPUs) all-reduce latency by method, the quick probe's timeline and its wall with the runner's
  # pool, probe accuracy + contention drill, the probe GPU tests, the matmul main job under the
  # daemon (pool on; the after-probe false-positive check).
  step probes
  timeout 150 python3 benchmarks/probe_latency.py "$out/probe" > "$out/probe_latency.txt" 2>&1
  timeout 150 python3 benchmarks/probe_accuracy.py "$out/probe" > "$out/probe_accuracy.txt" 2>&1
  timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/runners/test_probes_all_reduce.py > "$out/pytest_ar.txt" 2>&1
  timeout 150 $K up --exit --port 8765 --data-dir /tmp/kl --spec examples/matmul.yaml > "$out/up_matmul.txt" 2>&1
  cp /tmp/kl/kernelab.db "$out/h200x2-matmul.db" 2>/dev/null
  for f in probe_latency probe_accuracy pytest_ar; do echo "=== $f"; tail -40 "$out/$f.txt"; done
  echo "=== up_matmul"; grep -E "took|verdict|degraded|contended|slower|faster|pool|error" "$out/up_matmul.txt" | head -30
elif [ "$part" = timing2 ]; then
  # (GPU 0 alone, GPU 1 idle) verdicts with the current defaults, methods with the old 50 us graph
  # window next to the default, the guard.
  step timing2
  export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 benchmarks/timing_accuracy.py --out "$out/timing" --part verdicts --runs 20 > "$out/verdicts.txt" 2>&1
  timeout 300 python3 benchmarks/timing_accuracy.py --out "$out/timing" --part methods --processes 10 \
    --graph-windows-us 50 > "$out/methods.txt" 2>&1
  timeout 90 python3 benchmarks/timing_accuracy.py --out "$out/timing" --part guard > "$out/guard.txt" 2>&1
  for f in verdicts methods guard; do echo "=== $f"; tail -50 "$out/$f.txt"; done
elif [ "$part" = run4 ]; then
  # (2 GPUs) all-reduce by method and quick probes with the pool; then timing2 on GPU 0 alone.
  step run4
  timeout 120 python3 benchmarks/probe_latency.py "$out/probe" --parts methods,pool --repeats 5 > "$out/probe_latency.txt" 2>&1
  timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/runners/test_probes_all_reduce.py > "$out/pytest_ar.txt" 2>&1
  export CUDA_VISIBLE_DEVICES=0
  timeout 130 python3 benchmarks/timing_accuracy.py --out "$out/timing" --part verdicts --runs 20 > "$out/verdicts.txt" 2>&1
  timeout 250 python3 benchmarks/timing_accuracy.py --out "$out/timing" --part methods --processes 10 \
    --graph-windows-us 50 > "$out/methods.txt" 2>&1
  timeout 40 python3 benchmarks/timing_accuracy.py --out "$out/timing" --part guard > "$out/guard.txt" 2>&1
  for f in probe_latency pytest_ar verdicts methods guard; do echo "=== $f"; tail -42 "$out/$f.txt"; done
elif [ "$part" = exp2 ]; then
  # (GPU 0 alone, GPU 1 idle) the graph timer's window sweep with clocks, then the methods table.
  step exp2
  export CUDA_VISIBLE_DEVICES=0
  timeout 60 python3 benchmarks/timing_accuracy.py --out "$out/timing" --part windows > "$out/windows.txt" 2>&1
  timeout 420 python3 benchmarks/timing_accuracy.py --out "$out/timing" --part methods --processes 10 \
    --graph-windows-us "${WINDOWS:-1000,10000}" > "$out/methods.txt" 2>&1
  for f in windows methods; do echo "=== $f"; tail -60 "$out/$f.txt"; done
elif [ "$part" = exp ]; then
  # (2 GPUs) probe latency by method and the quick probe's timeline; then, on GPU 0 alone with GPU 1
  # idle, the graph timer's window sweep and the methods table with extra windows.
  step exp
  timeout 150 python3 benchmarks/probe_latency.py "$out/probe" > "$out/probe_latency.txt" 2>&1
  timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/runners/test_probes_all_reduce.py > "$out/pytest_ar.txt" 2>&1
  export CUDA_VISIBLE_DEVICES=0
  timeout 60 python3 benchmarks/timing_accuracy.py --out "$out/timing" --part windows > "$out/windows.txt" 2>&1
  timeout 330 python3 benchmarks/timing_accuracy.py --out "$out/timing" --part methods --processes 10 \
    --graph-windows-us "${WINDOWS:-1000,10000}" > "$out/methods.txt" 2>&1
  for f in probe_latency pytest_ar windows methods; do echo "=== $f"; tail -45 "$out/$f.txt"; done
else
  step timing accuracy
  timeout 300 python3 benchmarks/timing_accuracy.py --out "$out" --part verdicts --runs 20 2>&1 | tee "$out/verdicts.txt"
  timeout 270 python3 benchmarks/timing_accuracy.py --out "$out" --part methods --processes 10 2>&1 | tee "$out/methods.txt"
fi
