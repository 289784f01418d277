# Sourced by the H200 session scripts (repo root, on the GPU node): installs the server wheels
# carried in .whl/ (the GPU node's Python has torch and triton only) into /tmp/site, puts them,
# benchmarks/ and the checkout on PYTHONPATH, and defines `step`, a timestamped heading.
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/benchmarks:$PWD
else
  export PYTHONPATH=$PWD/benchmarks:$PWD
fi
export PYTHONUNBUFFERED=1
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
