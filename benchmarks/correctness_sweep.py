"""Correctness sweep through kernelab's own path (``run_job`` -> ``compare`` -> tables).

Runs ``examples/conv3d_row_guard.yaml`` (conv3d incl. the aliasing shape, 200 poisoned repeats,
20 determinism runs), ``examples/bi_matmul.yaml`` (M in {1, 8, 64, 4096}, batch invariance) and
``examples/chunked_attention.yaml`` (D in {64, 128, 192}, monolithic vs split bitwise) on this
node's device (the GPU when there is one; small shapes on a CPU), and writes into OUT_DIR, per
spec: ``<name>.json`` (the JobResult), ``<name>.txt`` (``kernelab run``'s table) and
``<name>.md`` (the Markdown export). Prints a Markdown summary table last.

    python benchmarks/correctness_sweep.py OUT_DIR
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPECS = ("conv3d_row_guard", "bi_matmul", "chunked_attention")


def main(out_dir: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from kernelab.runners.job import run_job
    from kernelab.runners.specfile import load_spec
    from kernelab.service.judge.report import check_summary, format_table, to_markdown
    from kernelab.service.judge.stats import compare

    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in SPECS:
        spec = load_spec(ROOT / "examples" / f"{name}.yaml")
        spec = spec.model_copy(update={"probes": spec.probes.model_copy(update={"all_reduce": False})})
        started = time.perf_counter()
        result = run_job(spec)
        wall_s = time.perf_counter() - started
        comparison = compare(result)
        (out_dir / f"{name}.json").write_text(result.model_dump_json(indent=1))
        table = format_table(comparison)
        (out_dir / f"{name}.txt").write_text(table)
        (out_dir / f"{name}.md").write_text(to_markdown(comparison))
        print(table, flush=True)
        print(f"[{name}: {wall_s:.1f} s]", flush=True)
        for cell in comparison.cells:
            for variant, check in cell.correctness.items():
                label = spec.candidate.variant if variant == "candidate" else spec.baseline.variant
                rows.append(
                    (
                        name,
                        cell.label,
                        f"{variant} ({label})",
                        ", ".join(cell.flags) or "-",
                        check_summary(check).replace("|", "\\|"),
                        cell.error or "",
                    )
                )
    print("\n| spec | cell | variant | flags | checks | error |\n| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python benchmarks/correctness_sweep.py OUT_DIR")
    main(Path(sys.argv[1]))
