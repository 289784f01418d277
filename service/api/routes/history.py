"""``/history``: a benchmark's results over time, per code, cell, GPU model, timer and state (read).

The data model and the rules (what a line is, what is excluded by default, when a change is
computed) are ``kernelab.service.history``'s.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from kernelab.service import history
from kernelab.service.api.deps import ReadToken, SessionDep, SettingsDep
from kernelab.service.schemas import Text

router = APIRouter(prefix="/history", tags=["history"])


@router.get("")
def get_history(
    _: ReadToken,
    session: SessionDep,
    settings: SettingsDep,
    benchmark: Annotated[Text, Query(min_length=1, max_length=500)],
    include_excluded: bool = False,
    limit: Annotated[int, Query(ge=1, le=500)] = history.DEFAULT_JOBS,
) -> history.HistoryPage:
    """The lines of ``benchmark`` over its ``limit`` latest results, revision and ordinary jobs
    alike. Points measured on a flagged node, or whose side's verdict is a problem (failed,
    incorrect, nondeterministic, implausible), are left out and counted in ``excluded`` unless
    ``include_excluded=true``."""
    return history.history(session=session, benchmark=benchmark, settings=settings,
                           include_excluded=include_excluded, limit=limit)  # fmt: skip
