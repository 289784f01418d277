"""Fleet drill: ``kill -9`` of runner daemons 20 times at random moments of their jobs (measuring,
spooling, posting, the next job) against a real ``kernelab serve`` on SQLite: every job
ends with exactly one result, nothing is left in any spool (``fleet_drills.kill_drill``). The same
drill on PostgreSQL is ``test_fault_drills_kill_pg.py``: one module per database, so that ``--dist
loadfile`` may hand the two (minutes each on a 2-core machine) to different processes. The other fleet
drills are ``test_fault_drills_fleet.py``; ``-s`` shows the drill's tally.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fleet_drills import kill_drill

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_runners_killed_20_times_at_random_moments_lose_nothing(
    migrated_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KERNELAB_LOG_FORMAT", "json")
    kill_drill(migrated_url, tmp_path)
