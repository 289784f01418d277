"""The types every inbound schema uses: text, timestamps, JSON objects, finite numbers, verdict names."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    ValidationInfo,
)

TimingVerdict = Literal["faster", "slower", "same", "inconclusive"]
"""What the timing alone says of a cell (``kernelab.service.verdicts.timing_verdict``)."""
Verdict = Literal[
    "failed",
    "incorrect",
    "nondeterministic",
    "implausible",
    "inconclusive",
    "faster",
    "slower",
    "same",
]
"""A cell's verdict, highest precedence first (``kernelab.service.verdicts``): correctness outranks speed."""
DeviceType = Literal["cpu", "cuda"]
JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
# Flags that travel with every number; their meaning is ``kernelab.service.verdicts.FLAG_NOTES``.
Flag = Literal[
    "noisy",
    "throttled",
    "contended",
    "degraded-node",
    "node-changed",
    "implausible",
    "incorrect",
    "less-accurate",
    "nondeterministic",
    "timer-mismatch",
    "timer-disagreement",
    "tampered",
    "failed",
]
Severity = Literal["error", "warning", "info"]

# --------------------------------------------------------------------------------------------------
# The types every inbound schema uses: text, timestamps, JSON objects, finite numbers
# --------------------------------------------------------------------------------------------------

TEXT_MAX_CHARS = 1_000_000
"""Longest inbound text field, characters (fields with a column of their own have tighter bounds)."""


def _refuse_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("text cannot contain the NUL character (U+0000)")
    return value


Text = Annotated[str, StringConstraints(max_length=TEXT_MAX_CHARS), AfterValidator(_refuse_nul)]
"""Inbound text: a str of at most ``TEXT_MAX_CHARS`` characters without U+0000. PostgreSQL's text
and JSON types cannot store NUL (SQLite can): refusing it here makes the answer a 422 whose ``loc``
names the field, the same on both databases, instead of a database error that names none."""


def _nul_free(value: Any) -> bool:
    """Whether no text in ``value`` (a str, or dicts/lists of them, keys included) holds U+0000."""
    if isinstance(value, str):
        return "\x00" not in value
    if isinstance(value, dict):
        return all(_nul_free(k) and _nul_free(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_nul_free(v) for v in value)
    return True


def _json_safe(value: dict[str, Any]) -> dict[str, Any]:
    if not _nul_free(value):
        raise ValueError("text cannot contain the NUL character (U+0000)")
    if not _finite_tree(value):
        raise ValueError("numbers must be finite (no NaN or Infinity)")
    return value


def _finite_tree(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite_tree(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_finite_tree(v) for v in value)
    return True


JsonObject = Annotated[dict[Text, Any], AfterValidator(_json_safe)]
"""An inbound free-form JSON object (e.g. an NVML process entry): keys and nested text as ``Text``
(no U+0000), nested numbers finite."""


def as_utc(value: datetime) -> datetime:
    """``value`` (aware) in UTC: 07:00+05:00 is 02:00+00:00. Raises ``ValueError`` for a naive one."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("a timestamp needs a time zone (e.g. '2026-12-01T07:00:00Z' or '+05:00')")
    return value.astimezone(UTC)


UtcDatetime = Annotated[
    AwareDatetime,
    AfterValidator(as_utc),
    Field(description="ISO 8601 with a zone (Z or +hh:mm), converted to UTC; a zone-less timestamp is a 422"),
]
"""Every timestamp kernelab takes or gives: ISO 8601 *with* a zone (``Z`` or ``+hh:mm``), converted
to UTC at the door (``07:00+05:00`` is stored and shown as ``02:00 UTC``). A zone-less timestamp is
refused with a 422 naming the field (``timezone_aware``): ISO 8601 reads it as local time of an
unknown zone, and guessing UTC would shift a runner that sends local time by hours."""

Finite = Annotated[float, Field(allow_inf_nan=False)]
"""A float that is not NaN or infinite (JSON has neither; PostgreSQL's JSON type refuses them)."""
Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]
"""A finite JSON number: ``true`` and ``"1e3"`` are refused, not read as 1.0 and 1000.0."""
Count = Annotated[int, Strict()]
"""A JSON integer: ``true``, ``2.0`` and ``"2"`` are refused."""

MAX_INT_VALUE = 2**63 - 1
"""Largest magnitude of an integer parameter value, sweep value or seed: int64, the widest integer
that torch (tensor shapes, ``torch.Generator.manual_seed``), numpy and both databases hold. A
benchmark's own ``Params`` narrows its parameters further (``kernelab.kernels.base.MAX_INT_PARAM``, int32)."""


MAX_SEED = 2**62
"""Largest ``seed``: the seeds the runner derives from it (``seed + i``, ``seed + 7919 (k + 1)``)
stay within int64, which ``torch.Generator.manual_seed`` takes."""

MAX_RTOL = 1.0
"""Largest ``correctness.rtol``: at ``rtol = 1`` an output of all zeros already passes
(``|0 - ref| <= rtol * |ref|``), so a looser one checks nothing (turn the check off with
``correctness.enabled: false`` instead)."""
MAX_ATOL = 1e6
"""Largest ``correctness.atol``: far above any tolerance a benchmark of ours needs (the matmul's
K-scaled atol stays below 1 for K up to 2**31), and finite; a larger one, like ``1e308``, accepts
every finite output and so checks nothing."""
MIN_INPUT_SCALE = 2.0**-10
MAX_INPUT_SCALE = 2.0**10
"""Bounds of ``correctness.input_scale`` (about 0.001 .. 1024). Inputs are drawn standard normal
(``|x| < 8`` in practice) and multiplied by the scale in the input's dtype: up to 2**10 they stay
below 2**13, far inside float16's finite range (65504), and down to 2**-10 typical inputs stay
above float16's smallest normal (2**-14, IEEE 754 binary16) instead of flushing to subnormals or
zero. ``1e308`` overflowed every input to ``inf`` and ``5e-324`` rounded every input to 0, so the
correctness check compared nothing; both were accepted at the door and failed on the runner."""

STORED: dict[str, Any] = {"stored": True}
"""Validation context for data read back from the database (``JobSpec.model_validate(row.spec,
context=STORED)``): the bounds a newer version applies at the door (``at_door``) are not applied
again to what an older version stored, so nothing stored makes a later read fail; everything a
stored value needs to be used (types, finiteness) is still checked."""


def at_door(info: ValidationInfo | None) -> bool:
    """True unless ``info``'s context is ``STORED``: a door-only bound applies."""
    return not (info is not None and isinstance(info.context, dict) and info.context.get("stored"))


def _int64(value: Any, info: ValidationInfo) -> Any:
    if (
        at_door(info)
        and isinstance(value, int)
        and not isinstance(value, bool)
        and abs(value) > MAX_INT_VALUE
    ):
        raise ValueError(f"an integer must be within +-{MAX_INT_VALUE} (int64)")
    return value


ParamValue = Annotated[int | Finite | Text | bool, AfterValidator(_int64)]
"""One parameter value: an integer within int64 (``MAX_INT_VALUE``: a larger one would be refused
only on the runner, by every cell), a finite float, text or a boolean."""


class _Strict(BaseModel):
    """Base for inbound schemas a person writes (specs, requests): unknown fields are an error that
    names the field; numbers are finite. Text fields are ``Text`` (no U+0000)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _Posted(BaseModel):
    """Base for what a runner posts (results, probe reports): every float is finite (NaN/Infinity:
    422 naming the field). Unknown fields are ignored, so a newer runner can post to an older
    server, except in samples (``Sample``, ``SampleColumns``), where a unit or a field the server
    does not know would change what a number means."""

    model_config = ConfigDict(allow_inf_nan=False)


# --------------------------------------------------------------------------------------------------
