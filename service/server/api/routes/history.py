"""``/history``: a benchmark's results over time, per code, cell, GPU model, timer and state, with
the change points of each line; ``/history/regressions``: the fleet's lines whose latest change
made them slower (read).

The data model and the rules (what a line is, what is excluded by default, when a change is
computed, how change points are detected) are ``kernelab.service.server.history``'s and
``kernelab.service.judge.changepoints``'.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.exceptions import RequestValidationError
from pydantic import AfterValidator, StringConstraints

from kernelab.service.contract.schemas import AtDoor, RegressionsPage, Text
from kernelab.service.contract.schemas.types import storable_text
from kernelab.service.judge import changepoints
from kernelab.service.server import history
from kernelab.service.server.api.deps import MinChangePct, ReadToken, SessionDep, SettingsDep
from kernelab.service.server.api.door import DoorRoute

router = APIRouter(prefix="/history", tags=["history"], route_class=DoorRoute)

CELL_FILTER_MAX_CHARS = 2_000
"""Longest ``cell`` item (``k=v``): a parameter name (at most 200 characters) and a value as text.
The whole request line must fit what servers take (RFC 9110, section 4.1, recommends supporting
URIs of at least 8,000 octets; uvicorn's h11 parser allows 16 KiB for the request head), so a query
item is bounded far below ``TEXT_MAX_CHARS``."""
CellItem = Annotated[str, StringConstraints(max_length=CELL_FILTER_MAX_CHARS), AfterValidator(storable_text)]
CellFilter = Annotated[
    list[CellItem] | None,
    Query(max_length=64, description="keep lines whose cell has these parameters: k=v"),
]


def parse_cell_filter(items: list[str] | None) -> dict[str, str]:
    """``["M=4", "dtype=float32"]`` -> ``{"M": "4", "dtype": "float32"}``. Raises a 422
    naming the query field ``cell`` for an item without ``=`` or with an empty key."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise RequestValidationError([{"loc": ("query", "cell"), "msg": f"expected k=v, got {item!r}",
                                           "type": "value_error", "input": item}])  # fmt: skip
        out[key.strip()] = value.strip()
    return out


def filter_page(
    page: history.HistoryPage, cell: dict[str, str], gpu_model: str | None
) -> history.HistoryPage:
    """``page`` with only the lines whose cell has every parameter of ``cell`` (compared as text)
    and, with ``gpu_model``, whose GPU model is it."""
    series = [
        s for s in page.series
        if all(k in s.params and str(s.params[k]) == v for k, v in cell.items())
        and (gpu_model is None or s.gpu_model == gpu_model)
    ]  # fmt: skip
    return page.model_copy(update={"series": series})


@router.get("")
def get_history(
    _: ReadToken,
    session: SessionDep,
    settings: SettingsDep,
    benchmark: Annotated[Text, AtDoor(max_length=500), Query(min_length=1)],
    include_excluded: bool = False,
    limit: Annotated[int, Query(ge=1, le=500)] = history.DEFAULT_JOBS,
    min_change_pct: MinChangePct = changepoints.DEFAULT_MIN_CHANGE_PCT,
    cell: CellFilter = None,
    gpu_model: Annotated[Annotated[Text, AtDoor(max_length=255)] | None, Query()] = None,
) -> history.HistoryPage:
    """The lines of ``benchmark`` over its ``limit`` latest results, revision and ordinary jobs
    alike, each with its points' medians and 95% CIs and its change points (PELT; ``method``
    says how). Points measured on a flagged node, or whose side's verdict is a problem (failed,
    incorrect, nondeterministic, implausible), are left out and counted in ``excluded`` unless
    ``include_excluded=true``. ``cell=k=v`` (repeatable) and ``gpu_model`` keep matching lines."""
    wanted = parse_cell_filter(cell)
    page = history.history(
        session=session, benchmark=benchmark, settings=settings, include_excluded=include_excluded,
        limit=limit, min_change_pct=min_change_pct,
    )  # fmt: skip
    return filter_page(page, wanted, gpu_model)


@router.get("/regressions")
def get_regressions(
    _: ReadToken,
    session: SessionDep,
    settings: SettingsDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = history.DEFAULT_REGRESSIONS,
    min_change_pct: MinChangePct = changepoints.DEFAULT_MIN_CHANGE_PCT,
) -> RegressionsPage:
    """Across the fleet, newest first: lines whose latest change point made them slower, with the
    jobs on both sides of the change (``kernelab.service.server.history.regressions``)."""
    return history.regressions(session=session, settings=settings, limit=limit, min_change_pct=min_change_pct)
