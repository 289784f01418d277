"""No document says the server imports a benchmark: it never does (runners advertise their
benchmarks and the server checks a spec against the advertised schema, ``docs/architecture.md``).
A record under ``docs/results/`` keeps its day's text when it carries a dated ``*Correction``."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_SENTENCE = re.compile(r"[^.!?]*[.!?]", flags=re.S)
_NEGATION = re.compile(r"\b(never|not|no|nor|without)\b", flags=re.I)
_CLAIM = re.compile(
    r"\bserver\b[^.]*\bimport(s|ing|ed)?\b[^.]*\bbenchmark|\bserver\b[^.]*\bbenchmark[^.]*\bimport(s|ing|ed)?\b",
    flags=re.I,
)


def _claims(text: str) -> list[str]:
    found = []
    for sentence in _SENTENCE.findall(text.replace("\n", " ")):
        if _CLAIM.search(sentence) and not _NEGATION.search(sentence):
            found.append(" ".join(sentence.split()))
    return found


def test_the_claim_finder_finds_the_claim_and_lets_the_negation_pass() -> None:
    assert _claims("A server checks a spec's benchmark by importing it, and a runner imports it.")
    assert _claims("The server validates the spec by importing the benchmark.")
    assert not _claims("The server never imports benchmark code.")


def test_no_document_says_the_server_imports_a_benchmark() -> None:
    wrong = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        if path.parent.name == "results" and re.search(
            r"^\*Correction \(\d{4}-\d{2}-\d{2}", text, flags=re.M
        ):
            continue
        wrong += [f"{path.relative_to(ROOT)}: {s}" for s in _claims(text)]
    assert wrong == []
