#!/usr/bin/env bash
# The H200 runs of "a trustworthy verdict in seconds" (2026-12-04). Usage (repo root, on the GPU
# node, server wheels and the kernelab wheel in .whl/): bash benchmarks/speed_h200.sh OUT [a|b]
# a: the GPU tests of the engine, the fork server and the job (default checks), then
#    benchmarks/verdict_speed.py on the softmax example's kernels: 1 and 10 cells beside do_bench and
#    an nvbench-like budget, then 100 cells with probes.
# b: the GPU tests again (their failures named), a 1-cell run's timeline, then with the decided stop:
#    A/A of the one-element softmax, the 1 GiB copy and the bf16 8192^3 matmul (20 jobs each,
#    default settings), the 0.5% sensitivity (20 + 20 A/A). c: the GPU cheats.
set -uo pipefail
out=${1:?usage: speed_h200.sh OUT [a|b]}; part=${2:-a}
mkdir -p "$out"
source benchmarks/gpu_node.sh
node_env "$out"
T="python3 benchmarks/timing_artefacts_h200.py $out"
if [ "$part" = a ]; then
  step gpu-tests; timeout 150 python3 -m pytest -q -p no:cacheprovider tests/runners/test_timing.py tests/runners/test_job.py tests/runners/test_forkserver.py tests/runners/test_engine.py tests/kernels/test_gpu.py > "$out/pytest_gpu.txt" 2>&1
  step speed-1-10; timeout 150 python3 benchmarks/verdict_speed.py "$out/vs" --device cuda --cells 1,10 --quick-tools > "$out/speed_small.txt" 2>&1
  step speed-100;  timeout 280 python3 benchmarks/verdict_speed.py "$out/vs100" --device cuda --cells 100 > "$out/speed_100.txt" 2>&1
  files="pytest_gpu speed_small speed_100"
elif [ "$part" = b ]; then
  step gpu-tests; timeout 200 python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/runners/test_timing.py tests/runners/test_job.py tests/runners/test_forkserver.py tests/kernels/test_gpu.py > "$out/pytest_gpu.txt" 2>&1
  step timeline;  timeout 60 python3 benchmarks/verdict_speed.py "$out/vs1" --device cuda --cells 1 > "$out/speed_1.txt" 2>&1; cp "$out/vs1/cells-1/timeline.txt" "$out/timeline_1.txt"
  step aa-one;  timeout 100 $T aa one 20 --in-process > "$out/aa_one.txt" 2>&1
  step aa-copy; timeout 100 $T aa copy 20 --in-process > "$out/aa_copy.txt" 2>&1
  step aa-mm;   timeout 120 $T aa mm 20 --in-process > "$out/aa_mm.txt" 2>&1
  step sens;    timeout 150 $T sens 20 --in-process --budget-ms 3000 > "$out/sens.txt" 2>&1
  files="pytest_gpu speed_1 timeline_1 aa_one aa_copy aa_mm sens"
elif [ "$part" = c ]; then
  step timeline;  timeout 60 python3 benchmarks/verdict_speed.py "$out/vs1" --device cuda --cells 1 > "$out/speed_1.txt" 2>&1; cp "$out/vs1/cells-1/timeline.txt" "$out/timeline_1.txt"
  step cheats;  timeout 300 python3 -m pytest -q -rf --tb=line -m gpu -p no:cacheprovider tests/adversarial/test_cheats_gpu.py > "$out/cheats.txt" 2>&1
  files="speed_1 cheats"
fi
for f in $files; do echo "=== $f"; tail -16 "$out/$f.txt"; done
