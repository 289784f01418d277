"""The reporting API of a workload (a program kernelab runs whole under ``torchrun``).

Inside each rank of a workload::

    from kernelab.workload import phase, metric, digest

    with phase("rollout"):          # seconds between two device syncs, this rank
        generate(...)
    metric("tokens_per_gpu_s", tokens / seconds / world, unit="tok/s")   # better="higher"
    digest("logprobs", logprobs)    # exact fingerprint (+ the values within a size cap)

Where records go: when the runner launched the program, ``KERNELAB_WORKLOAD_RECORDS`` names a
folder and each rank appends to ``rank-<RANK>.jsonl`` there, one record per line, each line one
``os.write`` on an ``O_APPEND`` file, so a rank that crashes leaves every record it finished (a
torn last line is ignored by the reader). Without that variable the lines go to stdout, where the
runner also reads them: a workload that cannot import kernelab prints them itself.

The line format (``RECORD_VERSION`` 1), one JSON object per line, keys in any order::

    {"kernelab": 1, "type": "phase",  "name": "rollout", "rank": 0, "seconds": 56.31, "synced": true}
    {"kernelab": 1, "type": "metric", "name": "tokens_per_gpu_s", "rank": 0, "value": 93.3,
     "unit": "tok/s", "better": "higher"}
    {"kernelab": 1, "type": "digest", "name": "logprobs", "rank": 0, "dtype": "float32",
     "shape": [8, 7168], "sha256": "<hex of the C-contiguous bytes>",
     "values_b64": "<float64 little-endian values, base64> or null"}

``rank`` defaults to 0; ``better`` to ``"higher"``; ``unit`` to ``""``. A phase name repeated in one
run (a loop of steps) adds up per rank. A stdout line may carry a prefix (torchrun's
``[rank0]:``): the reader takes the text from the first ``{``. Importing this module imports
neither torch nor numpy; ``phase`` syncs CUDA only when the program imported torch and CUDA is
initialised.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any, Literal

RECORD_VERSION = 1
ENV_RECORDS = "KERNELAB_WORKLOAD_RECORDS"
ENV_DIGEST_MAX_BYTES = "KERNELAB_WORKLOAD_DIGEST_MAX_BYTES"
DEFAULT_DIGEST_MAX_BYTES = 4 << 20  # 4 MiB of float64 values: 524,288 elements

__all__ = ["ENV_RECORDS", "RECORD_VERSION", "digest", "metric", "phase", "record_line"]


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def record_line(record: dict[str, Any]) -> str:
    """``record`` as one line of the format above (``"kernelab": 1`` added, no newline inside)."""
    return json.dumps({"kernelab": RECORD_VERSION, **record}, separators=(",", ":"), allow_nan=False)


def _emit(record: dict[str, Any]) -> None:
    line = (record_line(record) + "\n").encode("utf-8")
    folder = os.environ.get(ENV_RECORDS)
    if not folder:
        sys.stdout.flush()
        os.write(sys.stdout.fileno(), line)
        return
    path = os.path.join(folder, f"rank-{record['rank']}.jsonl")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)  # one write per record: a crash leaves whole lines
    finally:
        os.close(fd)


def _sync() -> bool:
    """Synchronise the current CUDA device when the program uses torch with CUDA; whether it did."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
            return True
    except Exception:  # a broken device is the workload's failure to report, not this probe's
        return False
    return False


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the block as phase ``name`` of this rank: ``time.perf_counter`` seconds between a device
    sync before and after it (``torch.cuda.synchronize``, when CUDA is in use), so queued kernels
    count in the phase that launched them. A block that raises records nothing."""
    synced = _sync()
    t0 = time.perf_counter()
    yield
    synced = _sync() and synced
    seconds = time.perf_counter() - t0
    _emit({"type": "phase", "name": str(name), "rank": _rank(), "seconds": seconds, "synced": synced})


def metric(name: str, value: float, *, unit: str = "", better: Literal["higher", "lower"] = "higher") -> None:
    """Report ``value`` (a finite float, e.g. tokens/GPU/s) of metric ``name`` for this rank.
    Raises ValueError for a non-finite value or a ``better`` other than ``higher``/``lower``."""
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"metric {name!r}: {value} is not finite")
    if better not in ("higher", "lower"):
        raise ValueError(f"metric {name!r}: better must be 'higher' or 'lower', not {better!r}")
    _emit(
        {"type": "metric", "name": str(name), "rank": _rank(), "value": value, "unit": unit, "better": better}
    )


def digest(name: str, tensor: Any) -> str:
    """Record an exact fingerprint of ``tensor`` (a ``torch.Tensor`` of any dtype and device, or a
    numpy array) as digest ``name`` of this rank; returns the SHA-256 hex.

    The fingerprint is SHA-256 over the C-contiguous bytes on the host, with dtype and shape: two
    digests are bitwise equal exactly when those agree. Within ``KERNELAB_WORKLOAD_DIGEST_MAX_BYTES``
    (default 4 MiB) of float64 values the values travel too (float64 holds every float16/bfloat16/
    float32 value exactly), so the server can count mismatching elements and the max |diff|."""
    cap = int(os.environ.get(ENV_DIGEST_MAX_BYTES, DEFAULT_DIGEST_MAX_BYTES))
    raw, dtype, shape, values = _tensor_bytes(tensor, cap)
    sha = hashlib.sha256(raw).hexdigest()
    rec = {
        "type": "digest",
        "name": str(name),
        "rank": _rank(),
        "dtype": dtype,
        "shape": shape,
        "sha256": sha,
    }
    rec["values_b64"] = base64.b64encode(values).decode("ascii") if values is not None else None
    _emit(rec)
    return sha


def _tensor_bytes(tensor: Any, cap: int) -> tuple[bytes, str, list[int], bytes | None]:
    """(raw bytes, dtype name, shape, float64 little-endian values or None past ``cap``)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(tensor, torch.Tensor):
        t = tensor.detach().to("cpu").contiguous()
        dtype = str(t.dtype).removeprefix("torch.")
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        values = None
        if t.numel() * 8 <= cap and not t.is_complex():
            values = t.to(torch.float64).numpy().astype("<f8").tobytes()
        return raw, dtype, list(t.shape), values
    import numpy as np

    a = np.ascontiguousarray(tensor)
    values = a.astype("<f8").tobytes() if a.size * 8 <= cap and a.dtype.kind in "biuf" else None
    return a.tobytes(), str(a.dtype), list(a.shape), values
