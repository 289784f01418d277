"""Small Triton kernels for the static-metrics tests (compiled ahead of time, never launched).

``sum_kernel`` reduces ``x`` (n,) float32 in ``BLOCK`` tiles (an inner loop) and stores one float
per program; with ``GUARD`` its epilogue adds exactly one integer compare (``pid < limit``) that
predicates the store, like a row guard.
"""

import triton
import triton.language as tl


@triton.jit
def sum_kernel(x_ptr, out_ptr, n, limit, BLOCK: tl.constexpr, GUARD: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n, BLOCK):
        acc += tl.load(x_ptr + start + offs, mask=start + offs < n, other=0.0)
    total = tl.sum(acc)
    if GUARD:
        tl.store(out_ptr + pid, total, mask=pid < limit)
    else:
        tl.store(out_ptr + pid, total)
