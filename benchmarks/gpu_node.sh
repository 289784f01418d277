# Sourced by the H200 session scripts (repo root, on the GPU node): installs this checkout as an
# editable kernelab (its subpackages are the top-level folders, mapped by pyproject.toml's
# package-dir: the checkout on PYTHONPATH alone does not import them) and the server wheels carried
# in .whl/ (the GPU node's Python has torch and triton only) into /tmp/site, puts them,
# benchmarks/ and the checkout on PYTHONPATH, and defines `step`, a timestamped heading.
# The node is offline: no build isolation (its own setuptools builds), no dependencies.
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --break-system-packages -e . || exit 1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/benchmarks:$PWD
else
  export PYTHONPATH=$PWD/benchmarks:$PWD
fi
export PYTHONUNBUFFERED=1
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
# node_env OUT: NVLink multicast off, and the GPU, driver and library versions into OUT/env.txt.
node_env() {
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  { nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
    python3 -c 'import torch, triton, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, triton.__version__)'; } > "$1/env.txt" 2>&1
  cat "$1/env.txt"
}
