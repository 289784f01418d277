#!/usr/bin/env bash
# Issue 18's H200 runs after the placement change (2026-12-03): the sensitivity target and A/A with
# many input sets, plus the GPU tests of the engine. Usage (repo root, on the GPU node, server
# wheels in .whl/): bash benchmarks/placement_h200.sh OUT [a|b]
set -uo pipefail
out=${1:?usage: placement_h200.sh OUT [a|b]}; part=${2:-a}
mkdir -p "$out"
source benchmarks/gpu_node.sh
T="python3 benchmarks/timing_artefacts_h200.py $out"
{ nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
  python3 -c 'import torch, triton, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, triton.__version__)'; } > "$out/env.txt" 2>&1
cat "$out/env.txt"
if [ "$part" = a ]; then
  step sens;         timeout 220 $T sens 20 --in-process --budget-ms 3000 > "$out/sens.txt" 2>&1
  step aa-one;       timeout 60 $T aa one 20 --in-process > "$out/aa_one.txt" 2>&1
  step aa-copy;      timeout 60 $T aa copy 15 --in-process > "$out/aa_copy.txt" 2>&1
  step aa-mm;        timeout 90 $T aa mm 20 --in-process > "$out/aa_mm.txt" 2>&1
  step gpu-tests;    timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/runners/test_timing.py tests/runners/test_job.py tests/runners/test_engine_energy.py > "$out/pytest_gpu.txt" 2>&1
  files="sens aa_one aa_copy aa_mm pytest_gpu"
else
  step aa-mm-fresh;  timeout 300 $T aa mm 20 --seed 100 > "$out/aa_mm_fresh.txt" 2>&1
  step aa-one-fresh; timeout 150 $T aa one 20 --seed 100 > "$out/aa_one_fresh.txt" 2>&1
  files="aa_mm_fresh aa_one_fresh"
fi
for f in $files; do echo "=== $f"; tail -6 "$out/$f.txt"; done
