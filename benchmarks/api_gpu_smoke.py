"""``kernelab.compare`` on a GPU: eager ``x * 2`` vs ``x + x`` (same result, same bytes) and a
wrong candidate (``x * 3``), as a user calls it from Python. Prints both tables and verdicts.

Usage: ``python benchmarks/api_gpu_smoke.py``
"""

from __future__ import annotations

import torch

import kernelab


def main() -> None:
    def inputs(device: torch.device, seed: int) -> dict[str, torch.Tensor]:
        g = torch.Generator(device=device).manual_seed(seed)
        return {"x": torch.rand(1 << 24, generator=g, device=device)}

    work = {"bytes_read": 4.0 * (1 << 24), "bytes_written": 4.0 * (1 << 24)}
    same = kernelab.compare(
        lambda x: x * 2, lambda x: x + x, inputs=inputs, reference=lambda x: x.double() * 2, work=work,
        device="cuda", measurement={"budget_ms": 1500},
    )  # fmt: skip
    print(same)
    wrong = kernelab.compare(
        lambda x: x * 2, lambda x: x * 3, inputs=inputs, reference=lambda x: x.double() * 2, work=work,
        device="cuda", measurement={"budget_ms": 500},
    )  # fmt: skip
    print(wrong)
    print(
        "verdicts:", [c.verdict for c in same.cells], [c.verdict for c in wrong.cells], "timer:", same.timer
    )


if __name__ == "__main__":
    main()
