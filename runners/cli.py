"""The ``kernelab`` command line: ``up``, ``serve``, ``runner``, ``submit``, ``run``, ``validate``, ``probe``,
``report``, ``token create|list|rotate|revoke``.

Every command that reads a spec reports a bad file as ``FILE:LINE: field: message`` and exits 2;
unreachable servers and refused requests are one-line messages, never tracebacks. Server URL and
token come from ``--server``/``--token`` or ``KERNELAB_SERVER`` / ``KERNELAB_TOKEN``.

``run``, ``submit --wait`` and ``report`` end with an exit status a CI can gate on:

* 0 (``EXIT_OK``): the job succeeded and no cell's verdict is in ``--fail-on``;
* 1 (``EXIT_FAILED``): a cell's verdict is in ``--fail-on`` (default ``failed,incorrect``; the
  cells are named on stderr), or the job failed (every cell failed, a revision that did not build
  or import, the runner's error), whatever ``--fail-on`` says;
* 2 (``EXIT_BAD_INPUT``): a bad spec, option (``--fail-on`` naming no such verdict) or job id;
* 3 (``EXIT_NO_VERDICT``): no verdict could be had: the server was unreachable or refused the
  request, ``--wait`` timed out, the job was cancelled.

The other commands exit 1 on an unreachable server or a refused request.
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from kernelab.runners.client import TERMINAL_JOB_STATUS, KernelabAPIError, KernelabClient, KernelabUnavailable
from kernelab.runners.specfile import SpecFileError, load_spec
from kernelab.service.schemas import CellComparison, Comparison, JobPublic, JobSpec, Verdict
from kernelab.service.verdicts import VERDICT_ORDER

EXIT_OK = 0
EXIT_FAILED = 1  # a cell's verdict is in --fail-on, or the job failed
EXIT_BAD_INPUT = 2
EXIT_NO_VERDICT = 3  # run/submit/report: server unreachable or refusing, wait timed out, job cancelled

GATE_VERDICTS: tuple[Verdict, ...] = tuple(v for v in VERDICT_ORDER if v not in ("faster", "same"))
"""Verdicts ``--fail-on`` may name (a faster or unchanged cell is never a failure)."""
DEFAULT_FAIL_ON = "failed,incorrect"
VERDICT_COLORS: dict[Verdict, tuple[str, bool]] = {
    "failed": ("red", True),
    "incorrect": ("red", True),
    "nondeterministic": ("yellow", False),
    "implausible": ("yellow", False),
    "faster": ("green", False),
}
"""Terminal colour (click colour name) and boldness of a verdict; the others are plain."""

WORKER_HEALTHCHECK_S = 120  # uvicorn --workers: seconds a busy worker may miss a health ping
# Idle HTTP keep-alive, s: longer than a runner's quietest gap (daemon heartbeat lease_s/3 = 40 s),
# so the server never closes a runner's connection just as the runner sends on it (uvicorn's 5 s
# default did: heartbeats 10 s apart raced the close and failed with ReadError).
KEEP_ALIVE_S = 75

app = typer.Typer(
    name="kernelab",
    help="Benchmark GPU kernels honestly: interleaved A/B measurement, node-health probes, verdicts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

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


def _fail(message: str, code: int = EXIT_FAILED) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(code)


def read_spec(path: Path) -> JobSpec:
    """Load ``path`` or exit 2 with one ``FILE:LINE: field: message`` line per problem."""
    try:
        return load_spec(path)
    except SpecFileError as exc:
        raise _fail(exc.render(), EXIT_BAD_INPUT) from None


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
        raise _fail(f"{spec_path}: {exc}", EXIT_BAD_INPUT) from None
    for side in ("baseline", "candidate"):
        source = getattr(spec, side).source
        if source is not None:
            typer.echo(f"{side}: {source.repo} @ {source.branch} ({source.ref[:12]})", err=True)
    return spec


def _client(server: str, token: str, **kwargs: Any) -> KernelabClient:
    if not token:
        raise _fail("no token: pass --token or set KERNELAB_TOKEN", EXIT_BAD_INPUT)
    return KernelabClient(server, token, **kwargs)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise


def _print_cell_progress(index: int, total: int, message: str) -> None:
    typer.echo(f"  [{index + 1}/{total}] {message}", err=True)


def parse_fail_on(text: str) -> frozenset[Verdict]:
    """The verdicts of a ``--fail-on`` comma list (case and spaces ignored). Exits 2 with a message
    naming ``--fail-on`` for an empty list, ``faster``/``same`` or a name that is no verdict."""
    names = [n.strip().lower() for n in text.split(",")]
    allowed = ", ".join(GATE_VERDICTS)
    if not any(names) or not all(names):
        raise _fail(f"--fail-on: {text!r} names no verdict; give a comma list of {allowed}", EXIT_BAD_INPUT)
    for name in names:
        if name in ("faster", "same"):
            raise _fail(f"--fail-on: {name!r} is not a failure; choose from {allowed}", EXIT_BAD_INPUT)
        if name not in GATE_VERDICTS:
            raise _fail(f"--fail-on: unknown verdict {name!r}; choose from {allowed}", EXIT_BAD_INPUT)
    return frozenset(v for v in GATE_VERDICTS if v in names)


def use_color() -> bool:
    """Colour the verdicts: stdout is a terminal and ``NO_COLOR`` (no-color.org) is unset or empty."""
    return not os.environ.get("NO_COLOR") and sys.stdout.isatty()


def paint_verdict(text: str, verdict: Verdict) -> str:
    """``text`` in the terminal colour of ``verdict`` (``VERDICT_COLORS``), ANSI escapes by click."""
    color = VERDICT_COLORS.get(verdict)
    return text if color is None else typer.style(text, fg=color[0], bold=color[1])


def print_comparison(comparison: Comparison) -> None:
    """Print the before/after table (verdicts in colour on a terminal, ``use_color``) and each
    probe report of a ``Comparison``."""
    from kernelab.service.report import format_table

    typer.echo(format_table(comparison, paint=paint_verdict if use_color() else None))
    if comparison.probes:
        from kernelab.runners.probes.format import format_probe_report

        for report in comparison.probes:
            typer.echo("")
            typer.echo(format_probe_report(report, comparison.node))


def gate(comparison: Comparison, fail_on: frozenset[Verdict]) -> int:
    """``EXIT_FAILED`` when a cell's verdict is in ``fail_on``, else ``EXIT_OK``; says which cells
    tripped the gate (per verdict, a few labels each) or that none did, on stderr."""
    from kernelab.service.report import cells_text

    tripped: dict[Verdict, list[CellComparison]] = {}
    for cell in comparison.cells:
        if cell.verdict in fail_on:
            tripped.setdefault(cell.verdict, []).append(cell)
    names = ",".join(v for v in GATE_VERDICTS if v in fail_on)
    if not tripped:
        typer.echo(
            f"gate passed: no cell is {' or '.join(v for v in GATE_VERDICTS if v in fail_on)} "
            f"(--fail-on {names})",
            err=True,
        )
        return EXIT_OK
    n = sum(len(cells) for cells in tripped.values())
    typer.echo(f"gate failed (--fail-on {names}): {n} of {len(comparison.cells)} cells", err=True)
    for v in GATE_VERDICTS:
        if v in tripped:
            typer.echo(f"  {v}: {cells_text([c.label for c in tripped[v]])}", err=True)
    return EXIT_FAILED


def show_job(
    client: KernelabClient, job: JobPublic, fail_on: frozenset[Verdict], *, markdown: bool = False
) -> int:
    """Print a finished ``job``'s comparison (its table, or with ``markdown`` the server's Markdown)
    and return the exit status: ``EXIT_NO_VERDICT`` for a cancelled job, ``EXIT_FAILED`` for a
    failed one (its error on stderr; its table too when it has a result), else ``gate``."""
    if job.status == "cancelled":
        typer.echo(f"job {job.id} cancelled: no verdict", err=True)
        return EXIT_NO_VERDICT
    try:
        comparison = client.comparison(job.id)
    except KernelabAPIError as exc:
        if exc.status_code != 409 or job.status == "succeeded":
            raise
        comparison = None  # a failed job without a result: its error is all there is
    if comparison is not None:
        if markdown:
            typer.echo(client.report_md(job.id))
        else:
            print_comparison(comparison)
    if job.status == "failed":  # fails the gate whatever --fail-on says
        typer.echo(f"job {job.id} failed" + (f": {job.error}" if job.error else ""), err=True)
        return EXIT_FAILED
    if job.status != "succeeded" or comparison is None:
        typer.echo(f"job {job.id} is {job.status}: no verdict yet", err=True)
        return EXIT_NO_VERDICT
    return gate(comparison, fail_on)


def wait_and_show(
    client: KernelabClient,
    job: JobPublic,
    *,
    timeout_s: float,
    progress_log: Path | None = None,
    fail_on: frozenset[Verdict] = frozenset({"failed", "incorrect"}),
) -> int:
    """Wait for ``job`` to finish, echoing status changes (and new progress lines of
    ``progress_log``, a runner log file); print its comparison. Returns the exit status
    (``show_job``); exits ``EXIT_NO_VERDICT`` when it is still unfinished after ``timeout_s``."""
    offset, partial = 0, b""

    def on_change(j: JobPublic) -> None:
        typer.echo(f"job {j.id}: {j.status}" + (f" on {j.node}" if j.node else ""), err=True)

    def relay_progress() -> None:  # complete new lines only: the runner may be mid-line
        nonlocal offset, partial
        if progress_log is None or not progress_log.exists():
            return
        with progress_log.open("rb") as fh:
            fh.seek(offset)
            chunk = fh.read()
        offset += len(chunk)
        *lines, partial = (partial + chunk).split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", errors="replace")
            if "progress:" in line:
                typer.echo("  " + line.split("progress:", 1)[1].strip(), err=True)

    deadline = time.monotonic() + timeout_s
    seen = None
    while True:
        job = client.get_job(job.id)
        if job.status != seen:
            seen = job.status
            on_change(job)
        relay_progress()
        if job.status in TERMINAL_JOB_STATUS:
            break
        if time.monotonic() > deadline:
            raise _fail(f"job {job.id} still {job.status} after {timeout_s:.0f} s", EXIT_NO_VERDICT)
        time.sleep(0.5)
    return show_job(client, job, fail_on)


# -------------------------------------------------------------------------------------------------
# local, no server


@app.command()
def run(
    spec_path: SpecArg,
    json_path: Annotated[Path | None, typer.Option("--json", help="write the Comparison JSON here")] = None,
    markdown_path: Annotated[Path | None, typer.Option("--markdown", help="write Markdown here")] = None,
    result_path: Annotated[Path | None, typer.Option("--result", help="write the raw JobResult JSON")] = None,
    repo: RepoOpt = ".",
    baseline_ref: BaselineRefOpt = None,
    candidate_ref: CandidateRefOpt = None,
    cache_dir: Annotated[
        Path, typer.Option("--cache-dir", help="clones and worktrees of source revisions")
    ] = DEFAULT_WORK_DIR / "revisions",
    fail_on: FailOnOpt = DEFAULT_FAIL_ON,
) -> None:
    """Run a job on this machine (no server) and print the comparison table.

    A spec whose sides name source revisions (or --baseline-ref/--candidate-ref) runs each side in
    its own worker process; the repositories the spec names are trusted (it is your own file).
    Exits 1 when a cell's verdict is in --fail-on or the job failed (module docstring).
    """
    gate_on = parse_fail_on(fail_on)
    spec = apply_refs(read_spec(spec_path), spec_path, repo, baseline_ref, candidate_ref)
    from kernelab.kernels import BenchmarkError
    from kernelab.runners.job import run_job
    from kernelab.service.stats import compare

    typer.echo(f"running {spec.benchmark}: {spec.baseline.variant} vs {spec.candidate.variant}", err=True)
    try:
        sources = [s.source for s in (spec.baseline, spec.candidate) if s.source is not None]
        if sources:
            from kernelab.runners.revision_job import run_revision_job
            from kernelab.runners.revisions import AllowList

            allow = AllowList([src.repo for src in sources])
            result = run_revision_job(spec, allow=allow, cache_dir=cache_dir, progress=_print_cell_progress)
        else:
            result = run_job(spec, progress=_print_cell_progress)
    except (BenchmarkError, RuntimeError) as exc:  # e.g. cuda without CUDA; RevisionError too
        raise _fail(f"{spec_path}: cannot run: {exc}") from None
    comparison = compare(result)
    if result_path is not None:
        result_path.write_text(result.model_dump_json(indent=2), encoding="utf-8")
    if json_path is not None:
        json_path.write_text(comparison.model_dump_json(indent=2), encoding="utf-8")
    if markdown_path is not None:
        from kernelab.service.report import to_markdown

        markdown_path.write_text(to_markdown(comparison), encoding="utf-8")
    print_comparison(comparison)
    if result.error:  # fails the gate whatever --fail-on says
        raise _fail(f"job failed: {result.error}")
    raise typer.Exit(gate(comparison, gate_on))


@app.command()
def validate(spec_path: SpecArg) -> None:
    """Check a spec as ``run`` and ``submit`` do (form, bounds, benchmark, variants, every cell's
    parameters) without running it: prints ``FILE: ok: ...`` and the cell counts, or one
    ``FILE:LINE: field: message`` line per problem and exits 2."""
    spec = read_spec(spec_path)
    typer.echo(
        f"{spec_path}: ok: {spec.benchmark}, {spec.baseline.variant} vs {spec.candidate.variant}; "
        f"{spec.cell_count('cpu')} cell(s) on cpu, {spec.cell_count('cuda')} on cuda"
    )


@app.command()
def probe(
    json_path: Annotated[Path | None, typer.Option("--json", help="write the ProbeReport JSON here")] = None,
    mode: Annotated[str, typer.Option("--mode", help="quick (before/after a job) or full")] = "quick",
    cuda_graph: Annotated[
        bool, typer.Option("--cuda-graph", help="full mode: also time the all-reduce as CUDA-graph replays")
    ] = False,
    server: Annotated[str | None, typer.Option("--server", help="judge against this server's band")] = None,
    token: TokenOpt = "",
    post: Annotated[bool, typer.Option("--post", help="with --server: store the report there")] = False,
) -> None:
    """Probe this node's health (copy bandwidth, all-reduce, telemetry), print the readings and the
    verdict: against the thresholds alone, or with --server against the node's band kept there."""
    from kernelab.runners.probes import node_info, run_probes
    from kernelab.runners.probes.format import format_probe_report, format_verdict
    from kernelab.service import health
    from kernelab.service.schemas import HealthBand, ProbeSpec

    if mode not in ("quick", "full"):
        raise _fail(f"--mode must be 'quick' or 'full', got {mode!r}", EXIT_BAD_INPUT)
    report = run_probes(ProbeSpec(mode=mode, cuda_graph=cuda_graph), "adhoc")  # type: ignore[arg-type]
    node = node_info()
    if json_path is not None:
        json_path.write_text(report.model_dump_json(indent=2), encoding="utf-8")
    typer.echo(format_probe_report(report, node))
    bands: dict[str, HealthBand] = {}
    source = "thresholds only (no band: pass --server to judge against the node's band)"
    if server is not None:
        with _client(server, token) as client:
            try:
                detail = client.get_node(node.hostname)
                bands = {b["figure"]: HealthBand.model_validate(b) for b in detail["health"]["bands"]}
                source = f"the bands of {server} for {node.hostname}"
            except KernelabAPIError as exc:
                if exc.status_code != 404:
                    raise _fail(str(exc)) from None
                source = f"thresholds only ({server} has no probes of {node.hostname} yet)"
            except KernelabUnavailable as exc:
                raise _fail(f"server unreachable: {exc}") from None
            if post:
                client.post_probe(node.hostname, report)
    reasons = health.evaluate(report, node_bands=bands)
    typer.echo(format_verdict(reasons, source))


@app.command()
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
    from kernelab.service.report import format_static

    spec = read_spec(spec_path)
    if device_type not in ("cuda", "cpu"):
        raise _fail(f"--cells must be cuda or cpu, got {device_type!r}")
    chosen = target or default_target("cuda" if _has_cuda() else "cpu")
    if chosen is None:
        raise _fail("no CUDA GPU here: name the target, e.g. --target sm_90a")
    from kernelab.runners.static_metrics.aot import parse_target

    try:
        parse_target(chosen)
    except ValueError as exc:
        raise _fail(f"--target: {exc}") from None
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


# -------------------------------------------------------------------------------------------------
# talking to a server


@app.command()
def submit(
    spec_path: SpecArg,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = "",
    wait: Annotated[bool, typer.Option("--wait", help="wait and print the comparison")] = False,
    timeout_s: Annotated[float, typer.Option("--timeout-s", help="how long --wait waits")] = 3600.0,
    repo: RepoOpt = ".",
    baseline_ref: BaselineRefOpt = None,
    candidate_ref: CandidateRefOpt = None,
    fail_on: FailOnOpt = DEFAULT_FAIL_ON,
) -> None:
    """Queue a job; print its id (with --wait, also the comparison table).

    ``--baseline-ref main --candidate-ref HEAD --repo .`` benchmarks two revisions of a checkout:
    refs are resolved to commits here; the runner must allow the repository (--allow-repo).
    With --wait, exits 1 when a cell's verdict is in --fail-on or the job failed, 3 when no verdict
    could be had (module docstring).
    """
    gate_on = parse_fail_on(fail_on)
    spec = apply_refs(read_spec(spec_path), spec_path, repo, baseline_ref, candidate_ref)
    with _client(server, token) as client:
        try:
            job = client.submit(spec)
            typer.echo(str(job.id))
            if wait:
                raise typer.Exit(wait_and_show(client, job, timeout_s=timeout_s, fail_on=gate_on))
        except KernelabAPIError as exc:
            raise _fail(
                f"{spec_path}: {exc.detail}" if exc.status_code == 422 else str(exc),
                EXIT_BAD_INPUT if exc.status_code == 422 else EXIT_NO_VERDICT,
            ) from None
        except KernelabUnavailable as exc:
            raise _fail(f"server unreachable: {exc}", EXIT_NO_VERDICT) from None


@app.command()
def report(
    job_id: Annotated[int, typer.Argument(help="job id")],
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = "",
    markdown: Annotated[bool, typer.Option("--markdown", help="Markdown for a pull request")] = False,
    fail_on: FailOnOpt = DEFAULT_FAIL_ON,
) -> None:
    """Print a job's comparison table (or its Markdown). Exits 1 when a cell's verdict is in
    --fail-on or the job failed, 2 for an unknown job, 3 while it has no verdict (module docstring)."""
    gate_on = parse_fail_on(fail_on)
    with _client(server, token) as client:
        try:
            raise typer.Exit(show_job(client, client.get_job(job_id), gate_on, markdown=markdown))
        except KernelabAPIError as exc:
            raise _fail(str(exc), EXIT_BAD_INPUT if exc.status_code == 404 else EXIT_NO_VERDICT) from None
        except KernelabUnavailable as exc:
            raise _fail(f"server unreachable: {exc}", EXIT_NO_VERDICT) from None


token_app = typer.Typer(
    help="Manage API tokens on a server (needs an admin token): create, list, rotate, revoke.",
    no_args_is_help=True,
)
app.add_typer(token_app, name="token")
TOKEN_RETRIES = 1  # an operator at a terminal: say "unreachable" after one retry, not after ~15 s


class TokenScope(StrEnum):
    """Scopes a token can be created with (``runner`` tokens come from runner registration)."""

    read = "read"
    submit = "submit"
    admin = "admin"


@contextmanager
def _one_line_errors(what: str) -> Iterator[None]:
    """Turn the client's errors into one line on stderr and exit status 1 (no traceback)."""
    try:
        yield
    except KernelabAPIError as exc:
        raise _fail(f"{what}: HTTP {exc.status_code}: {exc.detail}") from None
    except KernelabUnavailable as exc:
        raise _fail(f"{what}: server unreachable: {exc}") from None


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Option("--name", help="who or what holds the token, e.g. ci")],
    scope: Annotated[TokenScope, typer.Option("--scope", help="admin implies submit implies read")],
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = "",
) -> None:
    """Create a token; print it once on stdout (the server keeps only its hash)."""
    with _client(server, token, retries=TOKEN_RETRIES) as client, _one_line_errors("token create"):
        issued = client.create_token(name, [scope.value])
    typer.echo(issued["token"])
    typer.echo(f"token {issued['id']} {issued['name']!r} ({', '.join(issued['scopes'])}): shown only now, "
               "store it", err=True)  # fmt: skip


@token_app.command("list")
def token_list(
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = "",
    live: Annotated[bool, typer.Option("--live", help="leave out revoked tokens")] = False,
) -> None:
    """List tokens (id, name, scopes, runner, created, revoked); never their secrets."""
    with _client(server, token, retries=TOKEN_RETRIES) as client, _one_line_errors("token list"):
        rows = client.list_tokens(live_only=live)
    table = [("ID", "NAME", "SCOPES", "RUNNER", "CREATED", "REVOKED")] + [
        (str(r["id"]), r["name"], ",".join(r["scopes"]), str(r["runner_id"] or ""), r["created_at"][:19],
         (r["revoked_at"] or "")[:19])
        for r in rows
    ]  # fmt: skip
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@token_app.command("rotate")
def token_rotate(
    token_id: Annotated[int, typer.Argument(help="token id (kernelab token list)", min=1)],
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = "",
) -> None:
    """Replace a token: a new one with the same name, scopes and runner is printed once on stdout and
    the old one is revoked. For a runner's token, start the runner with ``--token NEW``."""
    what = f"token rotate {token_id}"
    with _client(server, token, retries=TOKEN_RETRIES) as client, _one_line_errors(what):
        # not idempotent: a retry after the server rotated would answer 409 (old token revoked)
        issued = dict(client.request("POST", f"/tokens/{token_id}/rotate", idempotent=False).json())
    typer.echo(issued["token"])
    runner = f", runner {issued['runner_id']}" if issued.get("runner_id") else ""
    typer.echo(f"token {issued['id']} {issued['name']!r} ({', '.join(issued['scopes'])}{runner}) replaces "
               f"token {token_id}, now revoked: shown only now, store it", err=True)  # fmt: skip


@token_app.command("revoke")
def token_revoke(
    token_id: Annotated[int, typer.Argument(help="token id (kernelab token list)", min=1)],
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = "",
) -> None:
    """Revoke a token: its next request gets 401. Revoking a revoked token is not an error."""
    what = f"token revoke {token_id}"
    with _client(server, token, retries=TOKEN_RETRIES) as client, _one_line_errors(what):
        row = client.revoke_token(token_id)
    typer.echo(f"token {row['id']} {row['name']!r} revoked at {row['revoked_at']}")


@app.command()
def runner(
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = "",
    name: Annotated[str, typer.Option(help="runner/node name")] = socket.gethostname(),
    once: Annotated[bool, typer.Option("--once", help="drain the queue, then exit")] = False,
    poll_s: Annotated[float, typer.Option("--poll-s", help="claim long-poll, seconds")] = 20.0,
    lease_s: Annotated[float, typer.Option("--lease-s", help="lease length, seconds")] = 120.0,
    grace_s: Annotated[float, typer.Option("--grace-s", help="SIGTERM grace for the running job")] = 60.0,
    work_dir: Annotated[Path, typer.Option("--work-dir", help="token, spool, scratch")] = DEFAULT_WORK_DIR,
    log_level: Annotated[str, typer.Option("--log-level")] = "INFO",
    allow_repo: AllowRepoOpt = None,
    probe_pool: Annotated[
        str,
        typer.Option(
            "--probe-pool",
            help="keep all-reduce probe ranks alive between probes: auto (2+ GPUs), on, off",
        ),
    ] = "auto",
    job_env: Annotated[
        list[str] | None,
        typer.Option(
            "--job-env",
            metavar="NAME",
            help="environment variable job code may see besides the built-in "
            "allow-list (repeatable; names that look like credentials are refused); docs/security.md",
        ),
    ] = None,
    job_isolation: Annotated[
        str,
        typer.Option(
            "--job-isolation",
            help="auto: run jobs in a private namespace hiding the work dir when the "
            "machine allows it (else warn); namespace: require it; none: never",
        ),
    ] = "auto",
    job_hide: Annotated[
        list[Path] | None,
        typer.Option(
            "--job-hide",
            metavar="DIR",
            help="a folder job code must not see besides the work dir "
            "(repeatable; e.g. a server's data dir on the same machine)",
        ),
    ] = None,
    benchmark: Annotated[
        list[str] | None,
        typer.Option(
            "--benchmark",
            metavar="MODULE:OBJECT",
            help="a benchmark this runner offers besides the built-ins and the installed "
            "kernelab.benchmarks entry points (repeatable); the server routes its jobs here",
        ),
    ] = None,
) -> None:
    """Run the runner daemon: claim jobs, run them in a child process, post results.

    The daemon advertises the benchmarks it offers with its claims (built-ins, entry points,
    ``--benchmark`` refs; described in an isolated child process), and the server routes it only
    jobs of those benchmarks (``kernelab.service.offers``).

    A token given as ``--token`` is moved out of the command line (any process can read
    ``/proc/PID/cmdline``): the daemon starts again with it in ``KERNELAB_TOKEN`` only, which its
    non-dumpable process keeps from same-user processes. Prefer ``KERNELAB_TOKEN`` or the saved
    token file in the first place (docs/security.md).
    """
    _token_out_of_argv(token)
    # A SIGTERM while the daemon starts (imports, node fingerprint, registration) stops it cleanly
    # (exit 0, nothing claimed) instead of killing it: the daemon's own handlers take over in run().
    started: list[Any] = []
    early_stop = threading.Event()

    def _stop_early(_signum: int, _frame: object) -> None:
        early_stop.set()
        for daemon_ in started:
            daemon_.stop()

    signal.signal(signal.SIGTERM, _stop_early)
    from kernelab.runners.daemon import AdvertError, Runner, RunnerTokenMismatchError
    from kernelab.runners.jobns import IsolationError, set_non_dumpable
    from kernelab.runners.revisions import AllowList, RevisionError

    _setup_logging(log_level)
    if not set_non_dumpable():  # same-uid job code must not read this process's environ or memory
        typer.echo(
            "runner: warning: prctl(PR_SET_DUMPABLE, 0) refused: same-uid processes can read "
            "this daemon's /proc/<pid>/environ",
            err=True,
        )
    try:  # an entry in a refused form stops the start, not every revision job later
        AllowList.from_env(allow_repo or [])
    except RevisionError as exc:
        raise _fail(str(exc), EXIT_BAD_INPUT) from None
    client = _client(server, token)
    try:
        daemon = Runner(
            client,
            name,
            once=once,
            poll_s=poll_s,
            lease_s=lease_s,
            work_dir=work_dir,
            grace_s=grace_s,
            allowed_repos=allow_repo or [],
            probe_pool=probe_pool,
            job_env_names=job_env or [],
            job_isolation=job_isolation,
            job_hide=job_hide or [],
            benchmarks=benchmark or [],
        )
    except ValueError as exc:
        client.close()
        raise _fail(str(exc), EXIT_BAD_INPUT) from None
    started.append(daemon)
    if early_stop.is_set():
        daemon.stop()
    try:
        daemon.run()
    except KernelabAPIError as exc:
        raise _fail(f"runner {name}: {exc}") from None
    except KernelabUnavailable as exc:
        raise _fail(f"runner {name}: server unreachable: {exc}") from None
    except (RunnerTokenMismatchError, IsolationError) as exc:
        raise _fail(str(exc)) from None
    except AdvertError as exc:
        raise _fail(str(exc), EXIT_BAD_INPUT) from None
    finally:
        daemon.close()
        client.close()
    typer.echo(repr(daemon), err=True)


def _token_out_of_argv(token: str) -> None:
    """Re-``exec`` this command without ``--token`` on its command line, the token in
    ``KERNELAB_TOKEN`` (``runner``'s docstring). Returns when the token is not on the command line."""
    argv = sys.argv[1:]
    if not token or not any(a == "--token" or a.startswith("--token=") for a in argv):
        return
    rest: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--token":
            skip = True
        elif not arg.startswith("--token="):
            rest.append(arg)
    os.execve(
        sys.executable,
        [sys.executable, "-P", "-m", "kernelab.runners.cli", *rest],
        {**os.environ, "KERNELAB_TOKEN": token},
    )


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="interface to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port", min=1, max=65535)] = 8000,
    workers: Annotated[int, typer.Option(help="uvicorn worker processes")] = 1,
    database_url: Annotated[
        str | None, typer.Option("--database-url", envvar="KERNELAB_DATABASE_URL", help="SQLAlchemy URL")
    ] = None,
) -> None:
    """Upgrade the database to the current schema, then serve the API and dashboard."""
    import uvicorn

    from kernelab.service.core.config import Settings
    from kernelab.service.core.db import upgrade

    if database_url:
        os.environ["KERNELAB_DATABASE_URL"] = database_url
    settings = Settings()
    upgrade(settings.database_url)
    extra: dict[str, Any] = {}
    if "timeout_worker_healthcheck" in inspect.signature(uvicorn.Config).parameters:
        # A large result body is parsed on the worker's event loop (seconds for a 1,000-cell sweep);
        # uvicorn's default 5 s worker health check would kill the worker mid-ingest.
        extra["timeout_worker_healthcheck"] = WORKER_HEALTHCHECK_S
    from kernelab.service import serve as server

    server.run(workers=workers, host=host, port=port, log_level=settings.log_level.lower(),
               timeout_keep_alive=KEEP_ALIVE_S, max_connections=settings.max_connections,
               header_timeout_s=settings.header_timeout_s, body_timeout_s=settings.body_timeout_s,
               body_min_bytes=settings.body_min_bytes, **extra)  # fmt: skip


@app.command()
def up(
    port: Annotated[int, typer.Option(help="TCP port on 127.0.0.1", min=1, max=65535)] = 8000,
    data_dir: Annotated[Path, typer.Option("--data-dir", help="database, token, logs")] = DEFAULT_DATA_DIR,
    spec_path: Annotated[Path | None, typer.Option("--spec", help="demo job (default: softmax)")] = None,
    exit_after: Annotated[bool, typer.Option("--exit", help="stop once the demo job is shown")] = False,
    timeout_s: Annotated[float, typer.Option("--timeout-s", help="wait for the demo job, s")] = 900.0,
) -> None:
    """Server on SQLite + a local runner + the demo job: prints the table, the URL and the token."""
    from kernelab.runners.local import LocalStack, ServerStartError, example_spec_path

    spec = read_spec(spec_path or example_spec_path("softmax"))
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops like Ctrl-C
    stack = LocalStack(data_dir, port)
    try:
        token = stack.start()
        typer.echo(f"server  {stack.url}  (database {stack.database_path}, logs in {stack.data_dir})")
        with KernelabClient(stack.url, token) as client:
            job = client.submit(spec)
            typer.echo(f"demo job {job.id}: {spec.name or spec.benchmark}", err=True)
            code = wait_and_show(client, job, timeout_s=timeout_s, progress_log=stack.runner_log)
        typer.echo("")
        typer.echo(f"dashboard  {stack.url}/login  (sign in with the token below)")
        typer.echo(f"token      {token}  (admin; kept in {stack.token_path})")
        if exit_after:
            raise typer.Exit(code)
        typer.echo("serving; Ctrl-C to stop", err=True)
        stack.wait()
    except KeyboardInterrupt:
        typer.echo("stopping", err=True)
    except ServerStartError as exc:
        raise _fail(str(exc)) from None
    except (KernelabAPIError, KernelabUnavailable) as exc:
        raise _fail(str(exc)) from None
    finally:
        stack.stop()


if __name__ == "__main__":
    app()
