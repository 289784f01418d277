"""Commands that work on this machine alone, with no server: ``run``, ``validate``, ``probe``
(``--server`` only to judge against a node's band) and ``static``."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from pydantic import BaseModel

from kernelab.runners.cli.common import (
    DEFAULT_FAIL_ON,
    DEFAULT_WORK_DIR,
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    BaselineRefOpt,
    CandidateRefOpt,
    FailOnOpt,
    NoProbesOpt,
    ProbesOpt,
    ReasonsOpt,
    RepoOpt,
    SpecArg,
    TableLayout,
    TableOpt,
    TokenOpt,
    apply_refs,
    check_benchmark_code,
    client_for,
    fail,
    print_cell_progress,
    read_spec,
    without_probes,
)
from kernelab.runners.cli.output import gate, parse_fail_on, print_comparison
from kernelab.runners.client import KernelabAPIError, KernelabUnavailable
from kernelab.service.contract.schemas import Comparison, JobResult, JobSpec, ProbeSpec, Verdict, WorkloadSpec

SpecsArg = Annotated[list[Path], typer.Argument(help="job spec(s), YAML or JSON", show_default=False)]
QuietOpt = Annotated[
    bool, typer.Option("--quiet", "-q", help="no progress lines, only the table and the gate")
]


def _import_in_background(module: str) -> None:
    """Import ``module`` in a daemon thread, while the specs are checked and the job's fork server
    starts (nothing is measured yet), so the comparison does not wait for it afterwards
    (``scipy.special``, what the comparison's statistics import: 0.3-0.5 s on a 2-core machine)."""
    import importlib
    import threading

    def load() -> None:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)

    threading.Thread(target=load, name=f"import-{module}", daemon=True).start()


def run(
    spec_paths: SpecsArg,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="write the Comparison JSON here (a list for several specs)")
    ] = None,
    markdown_path: Annotated[Path | None, typer.Option("--markdown", help="write Markdown here")] = None,
    result_path: Annotated[
        Path | None, typer.Option("--result", help="write the raw JobResult JSON (a list for several specs)")
    ] = None,
    repo: RepoOpt = ".",
    baseline_ref: BaselineRefOpt = None,
    candidate_ref: CandidateRefOpt = None,
    cache_dir: Annotated[
        Path, typer.Option("--cache-dir", help="clones and worktrees of source revisions")
    ] = DEFAULT_WORK_DIR / "revisions",
    fail_on: FailOnOpt = DEFAULT_FAIL_ON,
    quiet: QuietOpt = False,
    no_probes: NoProbesOpt = False,
    probes: ProbesOpt = False,
    reasons: ReasonsOpt = False,
    table: TableOpt = TableLayout.cells,
) -> None:
    """Run jobs on this machine (no server) and print each comparison table (last: --probes and
    --reasons print before it).

    Every spec is checked (and its benchmark's code, before anything is measured) before the first
    one runs; each runs as the runner runs it: in a child process killed after the spec's
    ``timeout_s``, Triton in interpreter mode on a CPU. A spec whose sides name source revisions
    (or --baseline-ref/--candidate-ref) runs each side in its own worker process; the repositories
    the spec names are trusted (it is your own file). Exits 1 when a cell's verdict is in --fail-on
    or a job failed (module docstring).
    """
    _import_in_background("scipy.special")  # the comparison needs it; meanwhile this process waits
    gate_on = parse_fail_on(fail_on)
    workload = _workload_spec(spec_paths)
    if workload is not None:
        from kernelab.runners.cli.workload import run_workload_spec

        if no_probes:
            workload = without_probes(workload)

        raise typer.Exit(
            run_workload_spec(
                spec_paths[0],
                workload,
                gate_on=gate_on,
                json_path=json_path,
                markdown_path=markdown_path,
                result_path=result_path,
                quiet=quiet,
            )
        )
    refs = baseline_ref is not None or candidate_ref is not None
    specs = []
    for spec_path in spec_paths:
        spec = apply_refs(
            read_spec(spec_path, check_benchmark=not refs), spec_path, repo, baseline_ref, candidate_ref
        )
        if spec.baseline.source is None and spec.candidate.source is None:
            check_benchmark_code(spec, spec_path)
        if no_probes:
            spec = without_probes(spec)
        specs.append((spec_path, spec))
    comparisons, results, status = [], [], EXIT_OK
    for spec_path, spec in specs:
        result, comparison, code = _run_one(
            spec_path, spec, cache_dir, gate_on, quiet, probes, reasons, table
        )
        results.append(result)
        comparisons.append(comparison)
        status = max(status, code)
    several = len(specs) > 1
    if result_path is not None:
        _write_models(result_path, results, several)
    if json_path is not None:
        _write_models(json_path, comparisons, several)
    if markdown_path is not None:
        from kernelab.service.judge.report import to_markdown

        markdown_path.write_text("\n\n".join(to_markdown(c) for c in comparisons), encoding="utf-8")
    raise typer.Exit(status)


def _workload_spec(spec_paths: Sequence[Path]) -> WorkloadSpec | None:
    """The workload spec when ``spec_paths`` is one file of ``kind: workload``; exits 2 naming the
    file for a workload among several specs or a workload spec's problems (``FILE:LINE``)."""
    from kernelab.runners.specfile import SpecFileError, load_any_spec

    found = []
    for path in spec_paths:
        try:
            spec = load_any_spec(path, check_benchmark=False)
        except SpecFileError as exc:
            raise fail(exc.render(), EXIT_BAD_INPUT) from None
        if isinstance(spec, WorkloadSpec):
            found.append((path, spec))
    if not found:
        return None
    if len(spec_paths) > 1:
        raise fail(
            f"{found[0][0]}: a workload spec runs alone: give it to kernelab run by itself", EXIT_BAD_INPUT
        )
    return found[0][1]


def _run_one(
    spec_path: Path,
    spec: JobSpec,
    cache_dir: Path,
    gate_on: frozenset[Verdict],
    quiet: bool,
    probes: bool = False,
    reasons: bool = False,
    table: TableLayout = TableLayout.cells,
) -> tuple[JobResult, Comparison, int]:
    """Run one spec and print its table (``print_comparison``: ``probes``, ``reasons``); the
    result, the comparison and the exit status."""
    from kernelab.kernels import BenchmarkError
    from kernelab.runners.job import run_job
    from kernelab.service.judge.stats import compare

    progress = None if quiet else print_cell_progress
    if not quiet:
        typer.echo(f"running {spec.benchmark}: {spec.baseline.variant} vs {spec.candidate.variant}", err=True)
    try:
        sources = [s.source for s in (spec.baseline, spec.candidate) if s.source is not None]
        if sources:
            from kernelab.runners.revision_job import run_revision_job
            from kernelab.runners.revisions import AllowList

            allow = AllowList([src.repo for src in sources])
            result = run_revision_job(spec, allow=allow, cache_dir=cache_dir, progress=progress)
        else:
            result = run_job(spec, progress=progress)
    except (BenchmarkError, RuntimeError) as exc:  # e.g. cuda without CUDA; RevisionError too
        raise fail(f"{spec_path}: cannot run: {exc}") from None
    comparison = compare(result)
    print_comparison(comparison, probes=probes, reasons=reasons, table=table)
    if result.error:  # fails the gate whatever --fail-on says
        typer.echo(f"job failed: {result.error}", err=True)
        return result, comparison, EXIT_FAILED
    return result, comparison, gate(comparison, gate_on)


def _write_models(path: Path, models: Sequence[BaseModel], several: bool) -> None:
    if several:
        path.write_text(
            "[\n" + ",\n".join(m.model_dump_json(indent=2) for m in models) + "\n]\n", encoding="utf-8"
        )
    else:
        path.write_text(models[0].model_dump_json(indent=2), encoding="utf-8")


def validate(spec_path: SpecArg) -> None:
    """Check a spec as ``run`` and ``submit`` do (form, bounds, benchmark, variants, every cell's
    parameters, the benchmark's methods and its declared work: ``kernelab.kernels.preflight``)
    without running it: prints ``FILE: ok: ...`` and the cell counts, or one
    ``FILE:LINE: field: message`` line per problem and exits 2. A workload spec (``kind:
    workload``) is checked for form only (nothing of the workload is imported)."""
    workload = _workload_spec([spec_path])
    if workload is not None:
        sides = [workload.baseline.function or " ".join(workload.baseline.command or []),
                 workload.candidate.function or " ".join(workload.candidate.command or [])]  # fmt: skip
        typer.echo(
            f"{spec_path}: ok: workload {sides[0]!r} vs {sides[1]!r}; {2 * workload.runs} runs of "
            f"{workload.launch.nproc_per_node} rank(s) x {workload.launch.nnodes} node(s)"
        )
        return
    spec = read_spec(spec_path)
    if spec.baseline.source is None and spec.candidate.source is None:
        check_benchmark_code(spec, spec_path)
    typer.echo(
        f"{spec_path}: ok: {spec.benchmark}, {spec.baseline.variant} vs {spec.candidate.variant}; "
        f"{spec.cell_count('cpu')} cell(s) on cpu, {spec.cell_count('cuda')} on cuda"
    )


def probe(
    json_path: Annotated[Path | None, typer.Option("--json", help="write the ProbeReport JSON here")] = None,
    mode: Annotated[str, typer.Option("--mode", help="quick (before/after a job) or full")] = "quick",
    cuda_graph: Annotated[
        bool, typer.Option("--cuda-graph", help="full mode: also time the all-reduce as CUDA-graph replays")
    ] = False,
    server: Annotated[
        str | None,
        typer.Option("--server", envvar="KERNELAB_SERVER", help="judge against this server's band"),
    ] = None,
    token: TokenOpt = "",
    post: Annotated[
        bool,
        typer.Option("--post", help="with --server: store the report there (a runner token of this node)"),
    ] = False,
) -> None:
    """Probe this node's health (copy bandwidth, all-reduce, telemetry), print the readings and the
    verdict: against the thresholds alone, or with --server against the node's band kept there.

    --post stores the report on the server: it takes a runner token of this node (``kernelab token
    create --scope runner``, or the runner daemon's own); a read token only reads the band. Without
    a token the verdict is the thresholds' alone, unless --post asks for the server."""
    if post and not server:
        raise fail("--post needs --server (or KERNELAB_SERVER)", EXIT_BAD_INPUT)
    if server and not token and not post:
        typer.echo(f"note: no token for {server}: judging by the thresholds only", err=True)
        server = None
    from kernelab.runners.probes import node_info, run_probes
    from kernelab.runners.probes.format import format_probe_report, format_verdict
    from kernelab.service.contract.schemas import HealthBand
    from kernelab.service.judge import health

    if mode not in ("quick", "full"):
        raise fail(f"--mode must be 'quick' or 'full', got {mode!r}", EXIT_BAD_INPUT)
    report = run_probes(ProbeSpec(mode=mode, cuda_graph=cuda_graph), "adhoc")  # type: ignore[arg-type]
    node = node_info()
    if json_path is not None:
        json_path.write_text(report.model_dump_json(indent=2), encoding="utf-8")
    typer.echo(format_probe_report(report, node))
    bands: dict[str, HealthBand] = {}
    source = "thresholds only (no band: pass --server to judge against the node's band)"
    if server is not None:
        with client_for(server, token) as client:
            try:
                detail = client.get_node(node.hostname)
                bands = {b["figure"]: HealthBand.model_validate(b) for b in detail["health"]["bands"]}
                source = f"the bands of {server} for {node.hostname}"
            except KernelabAPIError as exc:
                if exc.status_code != 404:
                    raise fail(str(exc)) from None
                source = f"thresholds only ({server} has no probes of {node.hostname} yet)"
            except KernelabUnavailable as exc:
                raise fail(f"server unreachable: {exc}") from None
            if post:
                try:
                    client.post_probe(node.hostname, report)
                except KernelabAPIError as exc:
                    hint = (
                        "; --post takes a runner token of this node (kernelab token create --scope runner)"
                        if exc.status_code == 403
                        else ""
                    )
                    raise fail(f"--post: {exc}{hint}") from None
                typer.echo(f"stored on {server} for node {node.hostname}", err=True)
    reasons = health.evaluate(report, node_bands=bands)
    typer.echo(format_verdict(reasons, source))


def static(
    spec_path: SpecArg,
    target: Annotated[
        str | None, typer.Option("--target", help="GPU to compile for, e.g. sm_90a (default: this GPU)")
    ] = None,
    device_type: Annotated[
        str, typer.Option("--cells", help="whose sweep cells to compile: cuda or cpu (sweep_by_device)")
    ] = "cuda",
    json_path: Annotated[Path | None, typer.Option("--json", help="write the comparisons here")] = None,
) -> None:
    """Compile both sides' Triton kernels ahead of time and diff their machine code (no GPU needed).

    For every sweep cell: registers, spills, shared memory, occupancy, instruction mix, innermost
    loop body, and the verdict IDENTICAL when the machine code is equal.
    """
    import json

    from kernelab.runners.static_metrics import default_target, static_comparisons
    from kernelab.service.judge.report import format_static

    spec = read_spec(spec_path)
    if device_type not in ("cuda", "cpu"):
        raise fail(f"--cells must be cuda or cpu, got {device_type!r}")
    chosen = target or default_target("cuda" if _has_cuda() else "cpu")
    if chosen is None:
        raise fail("no CUDA GPU here: name the target, e.g. --target sm_90a")
    from kernelab.runners.static_metrics.target import parse_target

    try:
        parse_target(chosen)
    except ValueError as exc:
        raise fail(f"--target: {exc}") from None
    cells = spec.cells(device_type)  # type: ignore[arg-type]
    pairs = [({**c, **spec.baseline.params}, {**c, **spec.candidate.params}) for c in cells]
    typer.echo(f"compiling {len(cells)} cell(s) x 2 sides for {chosen}", err=True)
    results = static_comparisons(spec, pairs, chosen)
    labels = [", ".join(f"{k}={v}" for k, v in c.items()) or "cell" for c in cells]
    if json_path is not None:
        payload = [{"params": c, **r.model_dump(mode="json")} for c, r in zip(cells, results, strict=True)]
        json_path.write_text(json.dumps(payload, indent=2), encoding="utf-8")
    typer.echo(format_static(list(zip(labels, results, strict=True))), nl=False)
    if any(r.error for r in results):
        raise typer.Exit(EXIT_FAILED)


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())
