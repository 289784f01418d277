"""Probe orchestration on the CPU: gloo all-reduce over sub-groups, full-mode sizes and groups,
and run_probes' quick/full modes (ranks started before the copy probe)."""

from __future__ import annotations

import pytest

from kernelab.runners.probes import run_probes
from kernelab.runners.probes.all_reduce import (
    full_sizes_bytes,
    measure_all_reduce,
    start_all_reduce,
    sub_groups,
)
from kernelab.service.contract.schemas import ProbeSpec

MIB = 1024**2


def test_full_sizes_and_sub_groups() -> None:
    sizes = full_sizes_bytes()
    assert sizes[0] == 8 and sizes[-2:] == (128 * MIB, 256 * MIB)
    assert all(b == 4 * a for a, b in zip(sizes[:-2], sizes[1:-1], strict=True))
    assert sub_groups(1) == [] and sub_groups(2) == []
    assert sub_groups(4) == [[0, 1], [2, 3]]
    assert sub_groups(8)[-2:] == [[0, 1, 2, 3], [4, 5, 6, 7]] and len(sub_groups(8)) == 6


def test_gloo_sub_group_sums_its_own_ranks() -> None:
    # Ranks 1 and 2 hold 2 and 3: their group must read 5 everywhere (correct=True), the world 6.
    rows = measure_all_reduce(
        "cpu", world_size=3, sizes_bytes=[8, 4096], warmup_iters=1, iters=3, groups=[[1, 2]], timeout_s=120
    )
    assert [(r.ranks, r.size_bytes) for r in rows] == [
        ([0, 1, 2], 8),
        ([0, 1, 2], 4096),
        ([1, 2], 8),
        ([1, 2], 4096),
    ]
    assert all(r.correct and r.backend == "gloo" and r.time_us > 0 for r in rows)
    assert [r.world_size for r in rows] == [3, 3, 2, 2]
    assert rows[2].busbw_gbps == pytest.approx(rows[2].algbw_gbps)  # 2(n-1)/n = 1 for n = 2


@pytest.mark.parametrize("group", [[0], [0, 5], [1, 1]])
def test_bad_groups_are_refused_before_any_process_starts(group: list[int]) -> None:
    with pytest.raises(ValueError, match="group"):
        start_all_reduce("cpu", groups=[group])


def test_run_probes_full_mode_on_cpu() -> None:
    report = run_probes(ProbeSpec(mode="full", nvml=False, matmul_peak=False), "adhoc", device_type="cpu")
    assert report.errors == {} and report.mode == "full"
    assert [r.size_bytes for r in report.all_reduce] == [8, 1024, 64 * 1024, MIB, 4 * MIB]
    assert all(r.correct for r in report.all_reduce)
    assert len(report.copy_bandwidth) == 1 and report.peer_copy == []
