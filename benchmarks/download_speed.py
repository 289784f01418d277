"""Download time of a sweep's raw samples (``GET /api/v1/jobs/{id}/samples``, CPU only, loopback).

    python benchmarks/download_speed.py [--db sqlite|postgres|both] [--cells 1000] [--repeat 3]
        [--workers 1] [--json OUT] [--pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test]

For each database (a SQLite file in a temp folder; a fresh PostgreSQL database, dropped after,
both from ``benchmarks.page_speed.database``):

1. ``kernelab serve`` (``benchmarks.server_load.Server``) with ``--workers`` on that database.
2. One sweep result of ``--cells`` cells (``benchmarks.server_load.sweep_result``: 2 variants x 3
   rounds x 100 samples per cell, 600,000 samples for 1,000 cells) posted through
   ``POST /api/v1/jobs/{id}/results``; then a wait until its background comparison is stored, so
   the downloads meet an idle server.
3. ``--repeat`` rounds of ``benchmarks.server_load.download_samples``: the whole JSON download,
   the whole CSV download (s, request start to the last byte read) and one 10,000-row page from the
   middle (ms). The median of each over the rounds; the body sizes (MiB). The JSON body is parsed
   once after the timed rounds and its row count checked against ``X-Total-Count``.

Prints a Markdown table last; ``--json`` writes every number to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.page_speed import database, ingest, wait_for_comparison  # noqa: E402
from benchmarks.server_load import TOKEN, Server, download_samples  # noqa: E402


def measure(kind: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Steps 1-3 of the module docstring on one database; times of every round and their medians."""
    with database(kind, args.pg_url, folder) as url:
        server = Server(url, args.workers, folder / f"server-{kind}.log")
        try:
            auth = {"Authorization": f"Bearer {TOKEN}"}
            with httpx.Client(base_url=server.base, headers=auth, timeout=600) as http:
                job, ingest_s = ingest(http, args.cells)
                comparison_s = wait_for_comparison(url, job)
                rounds = [download_samples(server.base, job) for _ in range(args.repeat)]
                rows = http.get(f"/api/v1/jobs/{job}/samples").json()
                assert len(rows) == rounds[0]["rows"], (len(rows), rounds[0]["rows"])
        finally:
            server.stop()
    medians = {k: statistics.median(r[k] for r in rounds) for k in ("json_s", "csv_s", "page_10000_ms")}
    return {"db": kind, "job_id": job, "cells": args.cells, "ingest_s": ingest_s,
            "comparison_wait_s": comparison_s, "rows": rounds[0]["rows"], "json_mib": rounds[0]["json_mib"],
            "csv_mib": rounds[0]["csv_mib"], **medians, "rounds": rounds}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", choices=("sqlite", "postgres", "both"), default="both")
    ap.add_argument("--cells", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3, help="download rounds; the table shows medians")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--pg-url",
        default=os.environ.get("KERNELAB_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
    )
    args = ap.parse_args()
    kinds = ("sqlite", "postgres") if args.db == "both" else (args.db,)
    with tempfile.TemporaryDirectory(prefix="download-speed-") as tmp:
        results = [measure(kind, args, Path(tmp)) for kind in kinds]
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    print(f"\nmedian of {args.repeat} rounds, {args.workers} worker(s), {os.cpu_count()} CPUs\n")
    print("| database | rows | JSON (s) | JSON MiB | CSV (s) | CSV MiB | 10,000-row page (ms) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['db']} | {r['rows']:,} | {r['json_s']:.2f} | {r['json_mib']:.0f} | {r['csv_s']:.2f}"
              f" | {r['csv_mib']:.0f} | {r['page_10000_ms']:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
