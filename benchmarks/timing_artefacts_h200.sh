#!/usr/bin/env bash
# Issue 18's H200 acceptance, in parts that fit one device call each (logs and JSON lines in OUT).
# Usage (repo root, on the GPU node, server wheels in .whl/): bash benchmarks/timing_artefacts_h200.sh OUT a|b|c
# a: copy cases (fresh processes), A/A in one process (one-element, 1 GiB copy, bf16 matmul; rotate and,
#    for the one-element kernel, fixed placement), the hand graph replay of the one-element kernel,
#    A/A of the one-element kernel in fresh processes.
# b: graph1 and engine again (after the flush and energy fixes), the 0.5% sensitivity runs, A/A of the bf16 matmul in one process, A/A of the 1 GiB copy and the matmul in fresh processes.
# c: power state, energy (counter and engine), the graph-replay diagnosis of the one-element kernel, GPU tests, the workload example.
set -uo pipefail
out=${1:?usage: timing_artefacts_h200.sh OUT a|b|c}; part=${2:?part}
mkdir -p "$out"
source benchmarks/gpu_node.sh
export NCCL_NVLS_ENABLE=0
T="python3 benchmarks/timing_artefacts_h200.py $out"
{ nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
  python3 -c 'import torch, triton, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, triton.__version__)'; } > "$out/env.txt" 2>&1
cat "$out/env.txt"
if [ "$part" = a ]; then
  step copy;        timeout 170 $T copy 10 > "$out/copy.txt" 2>&1
  step aa-shared;   timeout 150 $T aa one,copy,mm 15 --in-process > "$out/aa_shared.txt" 2>&1
  step aa-fixed;    timeout 45 $T aa one 15 --in-process --placement fixed > "$out/aa_fixed.txt" 2>&1
  step graph1;      timeout 30 $T graph1 > "$out/graph1.txt" 2>&1
  step aa-fresh1;   timeout 130 $T aa one 20 --seed 100 > "$out/aa_fresh_one.txt" 2>&1
  files="copy aa_shared aa_fixed graph1 aa_fresh_one"
elif [ "$part" = b ]; then
  step graph1;      timeout 40 $T graph1 > "$out/graph1.txt" 2>&1
  step engine;      timeout 70 $T engine > "$out/engine.txt" 2>&1
  step sens;        timeout 150 $T sens 20 --in-process > "$out/sens.txt" 2>&1
  step aa-mm-shared; timeout 90 $T aa mm 10 --in-process > "$out/aa_mm_shared.txt" 2>&1
  step aa-fresh;    timeout 170 $T aa copy,mm 8 --seed 100 > "$out/aa_fresh.txt" 2>&1
  files="graph1 engine sens aa_mm_shared aa_fresh"
else
  step state;       timeout 40 $T state > "$out/state.txt" 2>&1
  step energy;      timeout 40 $T energy > "$out/energy.txt" 2>&1
  step graph1;      timeout 40 $T graph1 > "$out/graph1.txt" 2>&1
  step engine;      timeout 120 $T engine > "$out/engine.txt" 2>&1
  step gpu-tests;   timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/runners/test_timing.py tests/runners/test_engine_energy.py > "$out/pytest_gpu.txt" 2>&1
  step workload;    timeout 190 python3 benchmarks/workload_h200.py --out "$out/workload" > "$out/workload.txt" 2>&1
  files="state energy graph1 engine pytest_gpu workload"
fi
for f in $files; do echo "=== $f"; tail -12 "$out/$f.txt"; done
