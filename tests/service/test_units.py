"""``kernelab.service.contract.units``: one way to write a size, for the CLI, the Markdown and the
dashboard."""

from __future__ import annotations

import pytest

from kernelab.service.contract.units import format_bytes

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (None, "-"),
        (8, "8 B"),
        (1536, "1.5 KiB"),
        (100_000, "97.7 KiB"),  # at most one decimal, wherever it is shown
        (1024**2, "1 MiB"),
        (64 * 1024**2, "64 MiB"),
        (60 * 1024**2 + 512 * 1024, "60.5 MiB"),
        (3 << 30, "3 GiB"),
        (5 * 1024**4, "5 TiB"),
        (3 * 1024**5, "3072 TiB"),
    ],
)
def test_format_bytes(n: int | None, text: str) -> None:
    assert format_bytes(n) == text


def test_every_size_the_reports_show_is_written_by_format_bytes() -> None:
    from kernelab.runners.probes import format as probe_format
    from kernelab.service.contract.probes import all_reduce, copy_bandwidth, peer_copy, telemetry
    from kernelab.service.judge import report
    from kernelab.web import routes

    # the probe declarations say how their sizes are shown (figures and tables take their labels)
    for module in (probe_format, report, routes, all_reduce, copy_bandwidth, peer_copy, telemetry):
        assert module.format_bytes is format_bytes, module.__name__
