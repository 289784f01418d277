"""``kernelab bisect``: find the first commit between a good and a bad revision that made a
benchmark slower, with revision A/B jobs on a server's runners.

The commits are ``git rev-list --reverse --ancestry-path GOOD..BAD`` (after ``GOOD``, up to and
including ``BAD``, oldest first: the commits that descend from the good end and lead to the bad
one, as ``git bisect`` considers them on a linear history). Every step is one revision job,
interleaved on one node: the step's commit as the candidate against the **good end** as the
baseline (never against the last good midpoint, so every step is judged against one reference),
judged by ``judge``:

* ``bad``: a cell is ``slower`` (beyond the spec's ``threshold_pct``, CI excluding it), and no cell
  is ``failed``/``incorrect``/``nondeterministic``/``implausible`` (correctness outranks speed);
* ``good``: every cell is ``same`` or ``faster``;
* ``undecided``: anything else: the job failed or was cancelled, a cell is ``failed``,
  ``incorrect``, ``nondeterministic``, ``implausible``, or ``inconclusive`` with no cell ``slower``.

The first step checks the ends (``BAD`` against ``GOOD``): unless it is ``bad`` there is nothing
to bisect and the bisect stops saying so. Then a binary search: ``ceil(log2 n)`` steps for ``n``
commits. An ``undecided`` step is run once more (a fresh job: a noisy node or a transient failure
may pass); undecided twice, the bisect **stops** and says where: the first bad commit is in the
range after the last good commit up to the first bad one known, and the commit it could not
judge. An undecided step is never taken as good or bad.

``Bisection`` is the search alone (pure: commits in, next commit to test out), so its rules are
tested without a server; ``kernelab.runners.cli.bisect`` runs the jobs and records every step on
the server (``POST /bisects``), whose page shows them as they come.
"""

from __future__ import annotations

import math
import subprocess
from dataclasses import dataclass, field
from typing import Literal

from kernelab.service.contract.schemas import (
    VERDICT_CATALOGUE,
    BisectCommit,
    BisectStep,
    CellComparison,
    Comparison,
    JobPublic,
    Verdict,
)

PROBLEM_VERDICTS: frozenset[Verdict] = frozenset(e.name for e in VERDICT_CATALOGUE if e.kind == "problem")
"""A cell of one makes the step undecided whatever the other cells say (correctness outranks speed)."""
BAD_VERDICTS: frozenset[Verdict] = frozenset(e.name for e in VERDICT_CATALOGUE if e.bisect == "bad")
"""A cell of one makes the step bad (``slower``), unless a cell is a problem."""
GOOD_VERDICTS: frozenset[Verdict] = frozenset(e.name for e in VERDICT_CATALOGUE if e.bisect == "good")
"""The step is good when every cell is one of these (``same``, ``faster``)."""
MAX_ATTEMPTS = 2  # an undecided step is run once more, then the bisect stops


class BisectError(Exception):
    """The range cannot be bisected (a ref that does not resolve, no commits between the ends, a
    good end that is no ancestor of the bad one); the message says which."""


def _git(repo: str, *args: str) -> str:
    done = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise BisectError(f"git {' '.join(args)} in {repo}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def commit_range(repo: str, good: str, bad: str) -> tuple[str, str, list[BisectCommit]]:
    """``(good sha, bad sha, commits)``: the commits after ``good`` up to and including ``bad``,
    oldest first (``git rev-list --reverse --ancestry-path``). Raises ``BisectError`` when a ref
    does not resolve, ``good`` is not an ancestor of ``bad``, or nothing lies between them."""
    good_sha = _git(repo, "rev-parse", "--verify", f"{good}^{{commit}}").strip()
    bad_sha = _git(repo, "rev-parse", "--verify", f"{bad}^{{commit}}").strip()
    if subprocess.run(["git", "-C", repo, "merge-base", "--is-ancestor", good_sha, bad_sha]).returncode != 0:
        raise BisectError(
            f"--good {good} ({good_sha[:12]}) is not an ancestor of --bad {bad} ({bad_sha[:12]})"
        )
    out = _git(repo, "rev-list", "--reverse", "--ancestry-path", "--format=%H %s", f"{good_sha}..{bad_sha}")
    commits = []
    for line in out.splitlines():
        if line.startswith("commit "):
            continue
        sha, _, subject = line.partition(" ")
        commits.append(BisectCommit(sha=sha, subject=subject[:500]))
    if not commits:
        raise BisectError(f"no commits between --good {good} and --bad {bad}")
    return good_sha, bad_sha, commits


def steps_needed(n_commits: int) -> int:
    """Steps of a bisect of ``n_commits`` commits when none is undecided: the ends, then
    ``ceil(log2 n)`` midpoints."""
    return 1 + math.ceil(math.log2(n_commits)) if n_commits > 1 else 1


@dataclass(frozen=True)
class Judgement:
    """A step's outcome and its evidence (the deciding cell; ``BisectStep``'s fields)."""

    outcome: Literal["good", "bad", "undecided"]
    reason: str
    verdict: Verdict | None = None
    cell: str = ""
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    summary: dict[str, int] = field(default_factory=dict)


def _evidence(cell: CellComparison) -> dict[str, object]:
    return {"verdict": cell.verdict, "cell": cell.label, "ratio": cell.ratio,
            "ci_low": cell.ci_low, "ci_high": cell.ci_high}  # fmt: skip


def _ratio_text(cell: CellComparison) -> str:
    if cell.ratio is None:
        return "no ratio"
    ci = (
        f" [{cell.ci_low:.3f}, {cell.ci_high:.3f}]"
        if cell.ci_low is not None and cell.ci_high is not None
        else ""
    )
    return f"ratio {cell.ratio:.3f}{ci}"


def judge(job: JobPublic, comparison: Comparison | None) -> Judgement:
    """A finished step's outcome (module docstring) from its job and comparison (None: none)."""
    from kernelab.service.judge.report import why

    if job.status != "succeeded" or comparison is None or not comparison.cells:
        what = job.error.splitlines()[0][:300] if job.error else "no comparison"
        return Judgement("undecided", f"job #{job.id} {job.status}: {what}")
    cells = comparison.cells
    summary: dict[str, int] = {}
    for c in cells:
        summary[c.verdict] = summary.get(c.verdict, 0) + 1
    problems = [c for c in cells if c.verdict in PROBLEM_VERDICTS]
    if problems:
        c = problems[0]
        return Judgement("undecided", f"{c.label}: {c.verdict}: {why(c)}", summary=summary, **_evidence(c))  # type: ignore[arg-type]
    bad = [c for c in cells if c.verdict in BAD_VERDICTS]
    if bad:
        c = max(bad, key=lambda x: x.ratio or 0.0)
        return Judgement("bad", f"{c.label}: {c.verdict}, {_ratio_text(c)}", summary=summary, **_evidence(c))  # type: ignore[arg-type]
    pending = [c for c in cells if c.verdict not in GOOD_VERDICTS]
    if pending:
        c = pending[0]
        return Judgement("undecided", f"{c.label}: {c.verdict}: {why(c)}", summary=summary, **_evidence(c))  # type: ignore[arg-type]
    c = max(cells, key=lambda x: x.ratio or 0.0)
    return Judgement("good", f"every cell same or faster; slowest {c.label}: {_ratio_text(c)}",
                     summary=summary, **_evidence(c))  # type: ignore[arg-type]  # fmt: skip


def step_record(
    job_id: int, commit: str, role: Literal["ends", "midpoint"], attempt: int, j: Judgement
) -> BisectStep:
    """The ``BisectStep`` the server stores for a judged step."""
    return BisectStep(
        job_id=job_id, commit=commit, role=role, attempt=attempt, outcome=j.outcome, reason=j.reason[:2000],
        verdict=j.verdict, cell=j.cell[:500], ratio=j.ratio, ci_low=j.ci_low, ci_high=j.ci_high,
        summary=j.summary,
    )  # fmt: skip


@dataclass
class Bisection:
    """The binary search over ``commits`` (oldest first, the bad end last), the good end before
    them. ``next()`` names the commit the next step tests (None when done); ``record(outcome)``
    takes its outcome. ``lo``: index of the last commit known good (-1: the good end), ``hi``:
    of the first known bad (None until the ends are checked)."""

    commits: list[BisectCommit]
    lo: int = -1
    hi: int | None = None
    attempt: int = 1
    stopped: str | None = None  # why it stopped without an answer

    @property
    def role(self) -> Literal["ends", "midpoint"]:
        return "ends" if self.hi is None else "midpoint"

    def next(self) -> BisectCommit | None:
        """The commit to test now, or None when found or stopped."""
        if self.stopped is not None:
            return None
        if self.hi is None:
            return self.commits[-1]
        if self.hi - self.lo <= 1:
            return None
        return self.commits[(self.lo + self.hi) // 2]

    def index(self) -> int:
        return len(self.commits) - 1 if self.hi is None else (self.lo + self.hi) // 2

    def record(self, outcome: Literal["good", "bad", "undecided"], reason: str) -> None:
        """Take the outcome of the step ``next()`` named (module docstring's rules)."""
        commit = self.commits[self.index()]
        if outcome == "undecided":
            if self.attempt < MAX_ATTEMPTS:
                self.attempt += 1
                return
            low = "the good end" if self.lo < 0 else self.commits[self.lo].sha[:12]
            high = self.commits[-1 if self.hi is None else self.hi].sha[:12]
            self.stopped = (
                f"could not decide {commit.sha[:12]} ({commit.subject}) in {MAX_ATTEMPTS} attempts: "
                f"{reason}; "
                + ("the ends themselves are undecided" if self.hi is None
                   else f"the first bad commit is after {low}, at or before {high}")
            )  # fmt: skip
            return
        self.attempt = 1
        if self.hi is None:
            if outcome == "good":
                self.stopped = f"the bad end {commit.sha[:12]} is not slower than the good end: {reason}"
                return
            self.hi = len(self.commits) - 1
            return
        if outcome == "bad":
            self.hi = self.index()
        else:
            self.lo = self.index()

    @property
    def first_bad(self) -> BisectCommit | None:
        """The first bad commit once found."""
        if self.stopped is None and self.hi is not None and self.hi - self.lo <= 1:
            return self.commits[self.hi]
        return None
