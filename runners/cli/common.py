"""What every ``kernelab`` command shares: exit statuses, option types, the server client, a spec
file read or a one-line exit.

Exit statuses of ``run``, ``submit --wait`` and ``report`` (the package docstring tells when each):
``EXIT_OK`` 0, ``EXIT_FAILED`` 1, ``EXIT_BAD_INPUT`` 2, ``EXIT_NO_VERDICT`` 3.
"""

from __future__ import annotations

import logging
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from kernelab.runners.cli.exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_NO_VERDICT, EXIT_OK
from kernelab.runners.client import KernelabClient
from kernelab.runners.specfile import SpecFileError, load_any_spec, load_spec
from kernelab.service.contract.schemas import VERDICT_CATALOGUE, JobSpec, ProbeSpec, Verdict, WorkloadSpec

__all__ = ["EXIT_BAD_INPUT", "EXIT_FAILED", "EXIT_NO_VERDICT", "EXIT_OK"]

GATE_VERDICTS: tuple[Verdict, ...] = tuple(e.name for e in VERDICT_CATALOGUE if e.gate != "never")
"""Verdicts ``--fail-on`` may name, in precedence order (``VerdictEntry.gate``: a faster or
unchanged cell is never a failure)."""
DEFAULT_GATE: frozenset[Verdict] = frozenset(e.name for e in VERDICT_CATALOGUE if e.gate == "default")
"""The verdicts ``--fail-on`` names by default (``failed``, ``incorrect``, ``slower``): the one default
of ``run``, ``submit --wait``, ``report``, ``up`` and the pytest plugin (``--kernelab-fail-on``). A
wrong or crashed side fails, and so does a slowdown the statistics decided (beyond the threshold,
the decision interval showing it): a gate that passes a 5,000x slowdown gates nothing. Verdicts that
could not decide (``inconclusive``) or that need a spec's request to mean something
(``nondeterministic``, ``implausible``) are named on request; a passed gate counts them
(``kernelab.runners.cli.output.not_gated_text``)."""
DEFAULT_FAIL_ON = ",".join(v for v in GATE_VERDICTS if v in DEFAULT_GATE)
"""``DEFAULT_GATE`` as ``--fail-on``'s text: ``"failed,incorrect,slower"``."""

FailOnOpt = Annotated[
    str,
    typer.Option(
        "--fail-on",
        help=f"exit 1 when a cell's verdict is in this comma list ({', '.join(GATE_VERDICTS)})",
    ),
]
ServerOpt = Annotated[str, typer.Option("--server", envvar="KERNELAB_SERVER", help="server root URL")]
TokenOpt = Annotated[
    str, typer.Option("--token", envvar="KERNELAB_TOKEN", help="bearer token", show_default=False)
]
SpecArg = Annotated[Path, typer.Argument(help="job spec, YAML or JSON", show_default=False)]
RepoOpt = Annotated[
    str, typer.Option("--repo", help="git repository of --baseline-ref/--candidate-ref (path or URL)")
]
BaselineRefOpt = Annotated[
    str | None, typer.Option("--baseline-ref", help="take the baseline's code from this revision of --repo")
]
CandidateRefOpt = Annotated[
    str | None, typer.Option("--candidate-ref", help="take the candidate's code from this revision of --repo")
]
AllowRepoOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--allow-repo",
        help="repository (path, URL, or pattern: '*' within one path segment, "
        "a last '**' any depth) jobs' source revisions may come from; repeatable; also "
        "KERNELAB_ALLOWED_REPOS",
    ),
]
DEFAULT_SERVER = "http://127.0.0.1:8000"
DEFAULT_WORK_DIR = Path.home() / ".kernelab"
DEFAULT_DATA_DIR = Path("kernelab-data")


def fail(message: str, code: int = EXIT_FAILED) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(code)


def read_spec(path: Path, *, check_benchmark: bool = True) -> JobSpec:
    """Load ``path`` or exit 2 with one ``FILE:LINE: field: message`` line per problem.

    With ``check_benchmark`` the benchmark is imported here to check variants and parameters
    (``kernelab.runners.specfile.load_spec``): the current directory is then on ``sys.path`` (as
    for ``python -m``), and on a machine that will run the spec on its CPU the Triton
    interpreter mode is set before that import (``configure_for_spec``). Without it (a spec whose
    code comes from revisions) nothing of the benchmark is imported.
    """
    try:
        if isinstance(load_any_spec(path, check_benchmark=False), WorkloadSpec):
            raise fail(
                f"{path}: kind: a workload spec (kind: workload) runs with `kernelab run` on one machine; "
                "the server and runner path of workloads is not built yet (docs/workloads.md)",
                EXIT_BAD_INPUT,
            )
        spec = load_spec(path, check_benchmark=False)
        if not check_benchmark:
            return spec
        configure_for_spec(spec, path)
        return load_spec(path)
    except SpecFileError as exc:
        raise fail(exc.render(), EXIT_BAD_INPUT) from None


ProbesOpt = Annotated[
    bool,
    typer.Option(
        "--probes",
        help="print the node-health probes' full tables before the comparison (by default one "
        "'probes:' line under the table sums them up)",
    ),
]
ReasonsOpt = Annotated[
    bool,
    typer.Option(
        "--reasons",
        help="print every reason of every cell before the comparison (the table's 'why' lines give "
        "each cell's deciding one, '(+N more reasons ...)' counts the others)",
    ),
]


class TableLayout(StrEnum):
    """The comparison table's layout (``print_comparison``): ``cells``, one column of cell labels
    (``kernelab.service.judge.report.cell_columns``); ``axes``, one column per sweep axis
    (``kernelab.service.judge.cell_table.axis_columns``)."""

    cells = "cells"
    axes = "axes"


TableOpt = Annotated[
    TableLayout,
    typer.Option(
        "--table",
        help="the comparison table's layout: 'cells' (one column of cell labels) or 'axes' (one "
        "column per sweep axis, each side's noise and GB/s, as nvbench's tables)",
    ),
]
NoProbesOpt = Annotated[
    bool, typer.Option("--no-probes", help="skip the node-health probes before and after")
]


def without_probes(spec: JobSpec | WorkloadSpec) -> Any:
    """``spec`` with no probe: a job's before and after (``ProbeSpec.off``), or a workload's before
    the first run and between runs."""
    if isinstance(spec, WorkloadSpec):
        return spec.model_copy(update={"probes": spec.probes.model_copy(update={"between_runs": False})})
    return spec.model_copy(update={"probes": ProbeSpec.off()})


def configure_for_spec(spec: JobSpec, path: Path) -> None:
    """Make this process import ``spec``'s benchmark as its measuring process will: the current
    directory and the spec file's directory (a benchmark module beside its spec) on ``sys.path``,
    and ``TRITON_INTERPRET`` set when the spec runs on this machine's CPU
    (``kernelab.kernels.triton_mode.configure_triton_env``: triton fixes its mode at its first
    import). Touches no GPU, and imports torch only where the installed build cannot say whether it
    sees one (``kernelab.runners.devices.torch_sees_cuda``)."""
    for folder in (os.getcwd(), str(Path(path).resolve().parent)):
        if folder not in sys.path:
            sys.path.append(folder)
    if "triton" in sys.modules:
        return
    from kernelab.kernels.triton_mode import configure_triton_env
    from kernelab.runners.devices import torch_sees_cuda

    device = spec.device
    if device == "auto":
        device = "cuda" if torch_sees_cuda() else "cpu"
    configure_triton_env(device)


def check_benchmark_code(spec: JobSpec, spec_path: Path) -> None:
    """Exit 2 with one line naming the file and method when ``spec``'s benchmark has a mistake
    that ``kernelab.kernels.preflight`` finds before measuring (a method kernelab cannot call as it
    does, ``work`` returning no ``kernelab.Work``, ...)."""
    from kernelab.kernels import BenchmarkError, get_benchmark
    from kernelab.kernels.preflight import check_benchmark, check_work

    try:
        bench = get_benchmark(spec.benchmark)
        check_benchmark(bench)
        for device_type in ("cpu", "cuda"):
            check_work(bench, spec, device_type)
    except BenchmarkError as exc:
        raise fail(f"{spec_path}: benchmark: {exc}", EXIT_BAD_INPUT) from None


def apply_refs(
    spec: JobSpec, spec_path: Path, repo: str, baseline_ref: str | None, candidate_ref: str | None
) -> JobSpec:
    """``spec`` with its sides taken from ``repo`` at the given refs (``kernelab.runners.revisions.
    with_revisions``); exits 2 naming the spec file when a ref does not resolve."""
    if baseline_ref is None and candidate_ref is None:
        return spec
    from kernelab.runners.revisions import RevisionError, is_dirty, is_url, with_revisions

    try:
        spec = with_revisions(spec, repo, baseline_ref, candidate_ref)
        if not is_url(repo) and "HEAD" in (baseline_ref, candidate_ref) and is_dirty(repo):
            typer.echo(
                f"note: {repo} has uncommitted changes; HEAD is the last commit, without them", err=True
            )
    except RevisionError as exc:
        raise fail(f"{spec_path}: {exc}", EXIT_BAD_INPUT) from None
    for side in ("baseline", "candidate"):
        source = getattr(spec, side).source
        if source is not None:
            typer.echo(f"{side}: {source.repo} @ {source.branch} ({source.ref[:12]})", err=True)
    return spec


def client_for(server: str, token: str, **kwargs: Any) -> KernelabClient:
    if not token:
        raise fail(
            'no token: pass --token, set KERNELAB_TOKEN or put token = "..." in the configuration '
            "file ($KERNELAB_CONFIG, default ~/.config/kernelab/config.toml)",
            EXIT_BAD_INPUT,
        )
    return KernelabClient(server, token, **kwargs)


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise


def print_cell_progress(index: int, total: int, message: str) -> None:
    typer.echo(f"  [{index + 1}/{total}] {message}", err=True)
