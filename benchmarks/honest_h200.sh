#!/usr/bin/env bash
# The H200 runs of "honest across time and in every corner" (2026-12-04). Usage (repo root, on the
# GPU node, server wheels in .whl/): bash benchmarks/honest_h200.sh OUT [a|b]
# a: the GPU tests (cheats: graph_stale, events constant at import; timing; job), the honest float32
#    GEMM, the reduction errors per dtype and K (IEEE and TF32), the one-element A/A (timer
#    disagreement, the pairs schedule).
# b: A/A of the 1 GiB copy and the bf16 8192^3 matmul, and the 0.5% sensitivity with its A/A.
set -uo pipefail
out=${1:?usage: honest_h200.sh OUT [a|b]}; part=${2:-a}
mkdir -p "$out"
source benchmarks/gpu_node.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T="python3 benchmarks/timing_artefacts_h200.py $out"
{ nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
  python3 -c 'import torch, triton, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, triton.__version__)'; } > "$out/env.txt" 2>&1
cat "$out/env.txt"
if [ "$part" = a ]; then
  step gpu-tests;  timeout 270 python3 -m pytest -q -m gpu -p no:cacheprovider tests/adversarial/test_cheats_gpu.py tests/runners/test_timing.py tests/runners/test_job.py tests/kernels/test_gpu.py > "$out/pytest_gpu.txt" 2>&1
  step gemm32;     timeout 120 python3 benchmarks/honest_h200.py "$out" gemm32 3 > "$out/gemm32.txt" 2>&1
  step errors;     timeout 60 python3 benchmarks/reduction_errors.py cuda 5 > "$out/errors.txt" 2>&1
  step errors-tf32; KERNELAB_TF32=1 timeout 60 python3 benchmarks/reduction_errors.py cuda 5 > "$out/errors_tf32.txt" 2>&1
  step aa-one;     timeout 90 $T aa one 20 --in-process > "$out/aa_one.txt" 2>&1
  files="pytest_gpu gemm32 errors errors_tf32 aa_one"
else
  step aa-copy;    timeout 120 $T aa copy 10 --in-process > "$out/aa_copy.txt" 2>&1
  step aa-mm;      timeout 150 $T aa mm 10 --in-process > "$out/aa_mm.txt" 2>&1
  step sens;       timeout 250 $T sens 20 --in-process --budget-ms 3000 > "$out/sens.txt" 2>&1
  files="aa_copy aa_mm sens"
fi
for f in $files; do echo "=== $f"; tail -14 "$out/$f.txt"; done
