"""Commands that read a server's stored results over time and across jobs: ``history`` (a
benchmark's lines with CIs and change points, or with ``--regressions`` the fleet's regressions)
and ``compare-jobs`` (job vs job, cell by cell)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kernelab.runners.cli.common import (
    DEFAULT_FAIL_ON,
    DEFAULT_SERVER,
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_NO_VERDICT,
    EXIT_OK,
    FailOnOpt,
    ServerOpt,
    TokenOpt,
    client_for,
    fail,
)
from kernelab.runners.cli.output import paint_verdict, parse_fail_on, use_color
from kernelab.runners.client import KernelabAPIError, KernelabUnavailable
from kernelab.service.contract.schemas import HistoryPage, JobVsJob

JsonOpt = Annotated[Path | None, typer.Option("--json", help="write the JSON answer here")]


def _ns(value: float | None) -> str:
    if value is None:
        return "—"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.4g} {unit}"
    return f"{value:.4g} ns"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:+.1f}%"


def _write(path: Path | None, text: str) -> None:
    if path is None:
        return
    try:
        path.write_text(text + "\n")
    except OSError as exc:
        raise fail(f"{path}: cannot write: {exc.strerror}", EXIT_BAD_INPUT) from None


def print_history(page: HistoryPage) -> None:
    """One block per line: its name, the points (median and 95% CI) oldest first, its change points."""
    if not page.series:
        typer.echo(f"{page.benchmark}: no line to show ({page.results} results read)")
        return
    for line in page.series:
        typer.echo(f"{line.name}")
        changes = {cp.index: cp for cp in line.change_points}
        shown = [p for p in line.points if p.excluded is None]
        for i, p in enumerate(shown):
            ci = f"[{_ns(p.ci_low_ns)}, {_ns(p.ci_high_ns)}]" if p.ci_low_ns is not None else "[no CI]"
            mark = ""
            if i in changes:
                cp = changes[i]
                mark = (
                    f"  <- change point {_pct(cp.change_pct)} ({cp.direction}), "
                    f"jobs #{cp.job_before} -> #{cp.job_after}"
                )
            typer.echo(f"  {p.measured_at:%Y-%m-%d %H:%M} job #{p.job_id}  {_ns(p.median_ns)} {ci}{mark}")
    typer.echo(f"change points: {page.method}")


def history(
    benchmark: Annotated[str, typer.Argument(help="benchmark name, as in the spec")],
    cell: Annotated[
        list[str] | None,
        typer.Option("--cell", help="keep lines whose cell has this parameter: k=v (repeatable)"),
    ] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="keep lines of this GPU model")] = None,
    limit: Annotated[int, typer.Option("--limit", help="latest results read")] = 50,
    include_excluded: Annotated[
        bool, typer.Option("--include-excluded", help="also points of flagged nodes and problem verdicts")
    ] = False,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = "",
    json_path: JsonOpt = None,
) -> None:
    """Print a benchmark's history: per code, cell, GPU model and timer/state, each result's median
    with its 95% CI and the change points detected (PELT). Exits 2 for a bad --cell, 1 when the
    server is unreachable or refuses."""
    for item in cell or []:
        if "=" not in item or not item.partition("=")[0].strip():
            raise fail(f"--cell: expected k=v, got {item!r}", EXIT_BAD_INPUT)
    with client_for(server, token) as client:
        try:
            page = client.history(benchmark, cell=cell, gpu_model=gpu, include_excluded=include_excluded,
                                  limit=limit)  # fmt: skip
        except KernelabAPIError as exc:
            raise fail(str(exc), EXIT_BAD_INPUT if exc.status_code == 422 else EXIT_FAILED) from None
        except KernelabUnavailable as exc:
            raise fail(f"server unreachable: {exc}", EXIT_FAILED) from None
    print_history(page)
    _write(json_path, page.model_dump_json(indent=1))


def print_job_vs_job(cmp: JobVsJob) -> None:
    """The header (both jobs, nodes, health), then one row per matched cell."""
    color = use_color()
    for name, s in (("A", cmp.a), ("B", cmp.b)):
        health = "not judged" if s.health is None else (", ".join(s.health.flags) or "healthy")
        copy = ", ".join(f"{k} {v:.1f} GB/s" for k, v in s.copy_gbps.items()) or "no probe"
        typer.echo(f"{name}: job #{s.job_id} {s.label} on {s.node_name} "
                   f"({s.node.device_name or s.node.device_type}, driver {s.node.driver_version or '-'}), "
                   f"{s.timer}/{s.state}; node health: {health}; copy {copy}")  # fmt: skip
    for note in cmp.notes:
        typer.echo(f"note: {note}")
    heads = f"{'A (pooled)':>12} {'B (pooled)':>12} {'Δ%':>9} {'95% CI':>20}  {'basis':<9}"
    typer.echo(f"{'cell':<32} {heads}  verdict")
    for c in cmp.cells:
        ci = (
            f"{_pct((c.ci_low - 1) * 100)}..{_pct((c.ci_high - 1) * 100)}"
            if c.ci_low is not None and c.ci_high is not None
            else "—"
        )
        verdict = paint_verdict(c.verdict, c.verdict) if color else c.verdict
        typer.echo(
            f"{c.label[:32]:<32} {_ns(c.a.median_ns):>12} {_ns(c.b.median_ns):>12} "
            f"{_pct(c.delta_pct):>9} {ci:>20}  {c.basis:<9}  {verdict}"
        )
        if c.noise is not None:
            n = c.noise
            typer.echo(f"    between runs: ±{n.sigma_pct:.2f}% per run ({n.runs} runs of {n.codes} codes "
                       f"on the {n.scope}, {n.df} degrees of freedom)")  # fmt: skip
        for r in c.reasons:
            if r.severity == "error":
                typer.echo(f"    why: {r.message}")
    if cmp.only_in_a:
        typer.echo(f"only in A: {'; '.join(cmp.only_in_a)}")
    if cmp.only_in_b:
        typer.echo(f"only in B: {'; '.join(cmp.only_in_b)}")
    typer.echo(f"method: {cmp.method}")


def compare_jobs(
    a: Annotated[int, typer.Argument(help="job A (the reference)")],
    b: Annotated[int, typer.Argument(help="job B, compared against A")],
    side: Annotated[
        str, typer.Option("--side", help="which side of each job: candidate or baseline")
    ] = "candidate",
    fail_on: FailOnOpt = DEFAULT_FAIL_ON,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = "",
    json_path: JsonOpt = None,
    wait_s: Annotated[
        float,
        typer.Option("--wait", min=0, help="seconds to wait for a large pair a compare worker computes"),
    ] = 600.0,
) -> None:
    """Compare two stored jobs of one benchmark cell by cell (B against A, the same side of each):
    medians, Δ% with its CI on a footing that holds what changed between the runs (the other side
    both jobs ran, as a control, else the cell's between-run noise from stored runs; without either
    the cell is inconclusive), verdict, and both nodes' health. A pair too
    large for one request is computed by the server's compare worker; this waits for it up to
    --wait seconds. Exits 1 when a cell's verdict is in --fail-on, 2 for an unknown job, other
    benchmark or bad option, 3 while a job has no comparison yet, the pair is still being compared
    after --wait, or the server is unreachable."""
    gate_on = parse_fail_on(fail_on)
    if side not in ("candidate", "baseline"):
        raise fail(f"--side: expected candidate or baseline, got {side!r}", EXIT_BAD_INPUT)
    with client_for(server, token) as client:
        try:
            cmp = client.compare_jobs(a, b, side=side, wait_s=wait_s)
        except TimeoutError as exc:
            raise fail(str(exc), EXIT_NO_VERDICT) from None
        except KernelabAPIError as exc:
            code = (
                EXIT_NO_VERDICT if exc.status_code in (409, 413) or exc.status_code >= 500 else EXIT_BAD_INPUT
            )
            raise fail(str(exc), code) from None
        except KernelabUnavailable as exc:
            raise fail(f"server unreachable: {exc}", EXIT_NO_VERDICT) from None
    print_job_vs_job(cmp)
    _write(json_path, cmp.model_dump_json(indent=1))
    bad = [c for c in cmp.cells if c.verdict in gate_on]
    for c in bad:
        typer.echo(f"{c.label}: {c.verdict}", err=True)
    raise typer.Exit(EXIT_FAILED if bad else EXIT_OK)
