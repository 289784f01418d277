"""The dashboard's view of verdicts, rendered from ``kernelab.service.contract.schemas.VERDICT_CATALOGUE``:
no stylesheet, template or script names a verdict by hand.

* ``verdict_css()``: the CSS rules of every verdict (its badge ``.verdict-NAME``, the left stripe of
  its table row ``tr.verdict-row-NAME``, the verdict word of its reason line
  ``.reason-NAME .reason-verdict``), which ``base.html`` writes in a ``<style>`` block after
  ``web/static/kernelab.css`` (same specificity, later: the catalogue's colours win over ``.badge``'s
  grey);
* ``template_globals()``: what the templates read of the catalogue (``verdict_info``, the problem
  verdicts and a bisect step's outcome per verdict for the pages' prose), and the filters
  ``verdict_class`` (``schemas.verdict_css_class``) and ``word_list`` (``"a, b or c"``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from markupsafe import Markup

from kernelab.service.contract.schemas import VERDICT_CATALOGUE, VERDICT_INFO, Verdict, verdict_css_class
from kernelab.service.judge.report import word_list


def verdict_css() -> str:
    """The CSS rules of every verdict in ``VERDICT_CATALOGUE``, one per line: its badge's background
    and text colour; its row's stripe (``inset Npx 0 COLOUR``) where it has one; its reason word's
    colour where it has one. Colours are the catalogue's ``#rrggbb`` values, so nothing in a rule
    comes from outside this module's constants."""
    rules = []
    for e in VERDICT_CATALOGUE:
        badge = verdict_css_class(e.name)
        rules.append(f".{badge} {{ background: {e.badge}; color: {e.badge_text}; }}")
        if e.stripe is not None:
            row = verdict_css_class(e.name, "row")
            rules.append(f"tr.{row} td:first-child {{ box-shadow: inset {e.stripe_px}px 0 {e.stripe}; }}")
        if e.ink is not None:
            reason = verdict_css_class(e.name, "reason")
            rules.append(f".{reason} .reason-verdict {{ color: {e.ink}; }}")
    return "\n".join(rules)


def _verdict_class(name: str, role: str = "badge") -> str:
    if role not in ("badge", "row", "reason"):
        raise ValueError(f"verdict_class: role {role!r} is none of badge, row, reason")
    return verdict_css_class(name, role)  # type: ignore[arg-type]


def template_globals() -> dict[str, Any]:
    """The Jinja globals of the catalogue: ``verdict_css`` (``verdict_css()``, marked safe: it is
    built from constants), ``verdict_info`` (name -> ``VerdictEntry``), ``problem_verdicts``
    (precedence order), ``bisect_verdicts`` (``good``/``bad``/``undecided`` -> verdicts)."""
    bisect: dict[str, list[Verdict]] = {"good": [], "bad": [], "undecided": []}
    for e in VERDICT_CATALOGUE:
        bisect[e.bisect].append(e.name)
    return {
        "verdict_css": Markup(verdict_css()),
        "verdict_info": VERDICT_INFO,
        "problem_verdicts": [e.name for e in VERDICT_CATALOGUE if e.kind == "problem"],
        "bisect_verdicts": bisect,
    }


def template_filters() -> dict[str, Callable[..., str]]:
    """The Jinja filters: ``verdict_class(name, role="badge")`` and ``word_list(words, last="or")``."""
    return {"verdict_class": _verdict_class, "word_list": word_list}
