"""The environment every process of a job gets: an allow-list, never the daemon's credentials.

Job code (install steps, benchmark modules, workers, git on a job's behalf) is code a submit token
chose, so it must not see what the runner daemon holds: ``KERNELAB_TOKEN``, an admin token, a
database URL, cloud keys. ``job_env`` keeps only the variables named here (the locale, ``PATH``,
the GPU stack's ``CUDA_*``/``NVIDIA_*``/``TRITON_*``/``TORCH_*``/``NCCL_*``/... settings and the
few ``KERNELAB_*`` variables a worker reads), plus names an operator adds with the runner's
``--job-env NAME`` (carried to nested children in ``KERNELAB_JOB_ENV``). A name that looks like a
secret (``SECRET_NAME``: ``*TOKEN*``, ``*SECRET*``, ``*PASSW*``, ``*KEY*``, ``*CREDENTIAL*``,
``*AUTH*``, ``*COOKIE*``, ``*SESSION*``) is dropped even when allow-listed.

``docs/security.md`` ("Job code on runners") states the trust model this is part of.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

JOB_ENV_NAMES_ENV = "KERNELAB_JOB_ENV"  # names an operator added (--job-env), comma/space separated
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|KEY|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)
ALLOWED_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TERM",
        "TZ",
        "TMPDIR",
        "PYTHONPATH",
        "PYTHONUNBUFFERED",
        "PYTHONHASHSEED",
        "PYTHONDONTWRITEBYTECODE",
        "NO_COLOR",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "LD_LIBRARY_PATH",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "COVERAGE_PROCESS_START",
        "KERNELAB_ALLOWED_REPOS",
        "KERNELAB_OWN_PIDS",
        "KERNELAB_ALL_REDUCE_POOL",
        "KERNELAB_SITE",
        "KERNELAB_JOBNS",
        JOB_ENV_NAMES_ENV,
    }
)
# the GPU stack's settings: CUDA/NVIDIA (devices, caches), ROCm/HIP, Triton, torch, NCCL/gloo,
# OpenMP/MKL thread counts, locale categories
ALLOWED_PREFIXES = (
    "LC_",
    "CUDA_",
    "NVIDIA_",
    "TRITON_",
    "TORCH_",
    "TORCHINDUCTOR_",
    "PYTORCH_",
    "NCCL_",
    "GLOO_",
    "OMP_",
    "MKL_",
    "HIP_",
    "ROCM_",
    "HSA_",
)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_secret_name(name: str) -> bool:
    """True for a variable name that looks like a credential (``SECRET_NAME``)."""
    return bool(SECRET_NAME.search(name))


def check_names(names: Iterable[str]) -> list[str]:
    """``names`` (the runner's ``--job-env``) as a list; raises ``ValueError`` naming the first
    that is not a variable name or that looks like a secret (``is_secret_name``): a credential
    never reaches job code, even when an operator asks."""
    out = []
    for name in names:
        if not _NAME.match(name):
            raise ValueError(f"--job-env {name!r} is not an environment variable name")
        if is_secret_name(name):
            raise ValueError(
                f"--job-env {name!r} looks like a credential ({SECRET_NAME.pattern}); "
                "job code never gets credentials"
            )
        out.append(name)
    return out


def operator_names(source: Mapping[str, str]) -> list[str]:
    """The names listed in ``KERNELAB_JOB_ENV`` of ``source`` (comma or whitespace separated)."""
    return [n for n in re.split(r"[\s,]+", source.get(JOB_ENV_NAMES_ENV, "")) if n]


def allowed(name: str, extra_names: Iterable[str] = ()) -> bool:
    """True when ``name`` may pass from the daemon's environment to job code."""
    if is_secret_name(name):
        return False
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES) or name in set(extra_names)


def job_env(
    overrides: Mapping[str, str] | None = None,
    *,
    source: Mapping[str, str] | None = None,
    names: Iterable[str] = (),
) -> dict[str, str]:
    """The environment for a job's child process.

    ``source`` (default ``os.environ``) filtered by ``allowed`` with the operator's ``names`` and
    those already listed in ``source``'s ``KERNELAB_JOB_ENV``; then ``overrides`` (values kernelab
    itself sets, e.g. ``PYTHONPATH``), which are taken as given. The union of operator names is
    written to ``KERNELAB_JOB_ENV`` so that nested children keep them. Never raises.
    """
    src = os.environ if source is None else source
    extra = [n for n in dict.fromkeys([*operator_names(src), *names]) if not is_secret_name(n)]
    env = {k: v for k, v in src.items() if allowed(k, extra)}
    if extra:
        env[JOB_ENV_NAMES_ENV] = ",".join(extra)
    else:
        env.pop(JOB_ENV_NAMES_ENV, None)
    env.update(overrides or {})
    return env
