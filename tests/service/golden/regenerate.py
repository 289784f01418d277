"""Rewrite the golden files of ``test_stats_oracles.py``: ``python tests/service/golden/regenerate.py``.

``compare_input.json`` holds a generated ``JobResult`` (``stats_cases.result``: every kind of cell)
and the arguments of ``compare``; ``compare_expected.json`` the ``Comparison`` it gives. Run it
only after an intended change of the statistics or the verdict rules, and review the diff.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))  # stats_cases

from stats_cases import PEAKS, result  # noqa: E402

from kernelab.service.judge.stats import compare  # noqa: E402

COMPARE = {"n_resamples": 500, "seed": 7, "peaks": PEAKS}


def main() -> None:
    job = result(seed=5, cells=36)
    (HERE / "compare_input.json").write_text(
        json.dumps({"compare": COMPARE, "result": job.model_dump(mode="json")}, separators=(",", ":")) + "\n"
    )
    comparison = compare(job, **COMPARE)  # type: ignore[arg-type]
    (HERE / "compare_expected.json").write_text(
        json.dumps(comparison.model_dump(mode="json"), indent=1) + "\n"
    )


if __name__ == "__main__":
    main()
