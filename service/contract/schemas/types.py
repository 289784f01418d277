"""The types every inbound schema uses: text, timestamps, JSON objects, finite numbers; the verdicts
and their catalogue (``VERDICT_CATALOGUE``: everything shown of each verdict, from which every view
of verdicts derives)."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    Strict,
    StringConstraints,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue, WithJsonSchema
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

M = TypeVar("M", bound=BaseModel)

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
"""A cell's verdict, highest precedence first: correctness outranks speed. Its name is its stored
form (the database, the JSON); everything else about it is its ``VERDICT_CATALOGUE`` entry, in the
same order (checked when this module is imported)."""
TimingVerdict = Literal["faster", "slower", "same", "inconclusive"]
"""What the timing alone says of a cell (``kernelab.service.judge.verdicts.timing_verdict``): every
verdict whose ``VerdictEntry.kind`` is not ``problem`` (checked when this module is imported)."""
VerdictKind = Literal["problem", "undecided", "decided"]
"""``problem``: the cell's timing is no result (kept, greyed, never a speed-up); ``undecided``: the
numbers stand but cannot decide; ``decided``: the timing decided."""
Gate = Literal["never", "on-request", "default"]
"""Whether a verdict fails a ``--fail-on`` gate (exit status 1): ``never`` (it may not be named),
``on-request`` (when named), ``default`` (when named, and named by default)."""
StepOutcome = Literal["good", "bad", "undecided"]
"""A bisect step's outcome (``kernelab.runners.bisect.judge``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VerdictEntry:
    """Everything about one verdict that is not its judgement (``kernelab.service.judge.verdicts``
    decides which verdict a cell gets): every view of verdicts (order, colours, CSS, gate, bisect,
    GitHub, Markdown, terminal) is derived from ``VERDICT_CATALOGUE``, so a new verdict is one entry
    there (and its name in ``Verdict``).

    * ``name``: the stored form; ``meaning``: what it says of a cell, one sentence (told where a
      cell of it has no recorded reason);
    * ``kind`` (``VerdictKind``): ``problem`` verdicts void the timing (``PROBLEM_VERDICTS``) and
      make a bisect step undecided whatever else a cell says; a ``problem`` or ``undecided`` cell
      has its deciding reason told under the table (``EXPLAINED_VERDICTS``);
    * ``gate`` (``Gate``): ``--fail-on``'s names and default; ``bisect`` (``StepOutcome``): what a
      cell of it makes of a bisect step;
    * ``github``: the level of a GitHub Actions annotation of a cell of it when the verdict is not
      in ``--fail-on`` (in it, ``error``); None: no annotation;
    * ``mark``: the sign before it in Markdown (``""``: none), ``bold``: bold in Markdown;
    * ``terminal``: its colour on a terminal (a click colour name; None: plain), ``terminal_bold``;
    * colours, ``#rrggbb``: ``plot`` (its points and tiles in the dashboard's figures), ``badge`` and
      ``badge_text`` (its badge), ``stripe`` and ``stripe_px`` (the left stripe of its table row; None:
      none), ``ink`` (the verdict word of its reason line; None: the page's text colour).
    """

    name: Verdict
    meaning: str
    kind: VerdictKind
    gate: Gate
    bisect: StepOutcome
    github: Literal["warning", "notice"] | None
    mark: str
    bold: bool
    terminal: str | None
    terminal_bold: bool = False
    plot: str
    badge: str
    badge_text: str
    stripe: str | None
    stripe_px: int = 3
    ink: str | None


# The dashboard's palette (web/static/kernelab.css: --red, --red-bg, --green, --green-bg, --amber,
# --grey-bg, --muted). Correctness outranks speed: a failed or wrong cell is solid red, not the pale
# red of ``slower``.
_RED, _RED_BG, _GREEN, _GREEN_BG = "#b3261e", "#fbe4e2", "#1f7a3d", "#e3f4e8"
_AMBER, _AMBER_TEXT, _AMBER_BADGE, _AMBER_BADGE_TEXT = "#e0a800", "#8a5a00", "#f0b400", "#3d2800"
_GREY_BG, _MUTED, _LIGHT_GREY = "#eceff3", "#6b7585", "#aab2bf"

VERDICT_CATALOGUE: tuple[VerdictEntry, ...] = (
    VerdictEntry(
        name="failed",
        meaning="a side raised or timed out, or the measurement cannot be trusted at all (kernelab's "
        "timing functions were replaced while the job ran)",
        kind="problem", gate="default", bisect="undecided", github="warning",
        mark="❌", bold=True, terminal="red", terminal_bold=True,
        plot="#111111", badge=_RED, badge_text="#ffffff", stripe=_RED, stripe_px=5, ink=_RED,
    ),
    VerdictEntry(
        name="incorrect",
        meaning="a side's output was wrong (eager check, the timed method or a CUDA-graph replay), or "
        "the call did something a kernel must not (modified its inputs, left work running after the "
        "timed window, returned a lazy output)",
        kind="problem", gate="default", bisect="undecided", github="warning",
        mark="❌", bold=True, terminal="red", terminal_bold=True,
        plot="#7b1fa2", badge=_RED, badge_text="#ffffff", stripe=_RED, stripe_px=5, ink=_RED,
    ),
    VerdictEntry(
        name="nondeterministic",
        meaning="a bitwise reproducibility the spec asked for does not hold (repeated runs on the same "
        "inputs, or a row computed in another batch, differed bitwise)",
        kind="problem", gate="on-request", bisect="undecided", github="warning",
        mark="⚠️", bold=True, terminal="yellow",
        plot="#c77c00", badge=_AMBER_BADGE, badge_text=_AMBER_BADGE_TEXT, stripe=_AMBER, stripe_px=5,
        ink=_AMBER_TEXT,
    ),
    VerdictEntry(
        name="implausible",
        meaning="a rate above the node's measured peak, a time per launch below what any launch takes "
        "on the device, or a timed call that launched no device work",
        kind="problem", gate="on-request", bisect="undecided", github="warning",
        mark="⚠️", bold=True, terminal="yellow",
        plot=_AMBER, badge=_AMBER_BADGE, badge_text=_AMBER_BADGE_TEXT, stripe=_AMBER, stripe_px=5,
        ink=_AMBER_TEXT,
    ),
    VerdictEntry(
        name="inconclusive",
        meaning="the numbers stand but cannot decide (no confidence interval, a CI that straddles the "
        "threshold, sides timed by different methods, a node that changed during the job, a candidate "
        "far less accurate than the baseline)",
        kind="undecided", gate="on-request", bisect="undecided", github="warning",
        mark="", bold=False, terminal=None,
        plot=_LIGHT_GREY, badge=_GREY_BG, badge_text=_MUTED, stripe=_LIGHT_GREY, ink=_MUTED,
    ),
    VerdictEntry(
        name="faster",
        meaning="the candidate is faster beyond the threshold, and the decision interval shows it",
        kind="decided", gate="never", bisect="good", github=None,
        mark="", bold=True, terminal="green",
        plot=_GREEN, badge=_GREEN_BG, badge_text=_GREEN, stripe=_GREEN, ink=None,
    ),
    VerdictEntry(
        name="slower",
        meaning="the candidate is slower beyond the threshold, and the decision interval shows it",
        kind="decided", gate="default", bisect="bad", github="warning",
        mark="", bold=True, terminal=None,
        plot=_RED, badge=_RED_BG, badge_text=_RED, stripe=_RED, ink=None,
    ),
    VerdictEntry(
        name="same",
        meaning="the whole 95% CI of the ratio lies within the threshold: no change that matters",
        kind="decided", gate="never", bisect="good", github=None,
        mark="", bold=True, terminal=None,
        plot=_MUTED, badge=_GREY_BG, badge_text="#445", stripe=None, ink=None,
    ),
)  # fmt: skip
"""Every verdict, in ``Verdict``'s order (precedence, highest first: also the display order), with
everything shown of it (``VerdictEntry``). Colours are the dashboard's palette."""

VERDICT_INFO: dict[Verdict, VerdictEntry] = {e.name: e for e in VERDICT_CATALOGUE}
"""``VERDICT_CATALOGUE`` by name."""


_CSS_NAME = re.compile("[a-z][a-z-]*")


def verdict_css_class(name: str, role: Literal["badge", "row", "reason"] = "badge") -> str:
    """The dashboard's CSS class of verdict ``name`` in ``role``: its badge (``verdict-NAME``), its
    table row (``verdict-row-NAME``), the cell of its reason line (``reason-NAME``). ``name`` may be
    a word that is no ``Verdict`` (a workload's ``better``, a change point's direction): the class
    is then unstyled. Raises ``ValueError`` for a name that is no CSS identifier."""
    if not _CSS_NAME.fullmatch(name):
        raise ValueError(f"verdict name {name!r} is no CSS class name (lowercase letters and '-')")
    return {"badge": "verdict-", "row": "verdict-row-", "reason": "reason-"}[role] + name


def _check_catalogue() -> None:
    """Raises ``TypeError`` when ``VERDICT_CATALOGUE`` and the ``Verdict``/``TimingVerdict`` types
    disagree (a verdict added to one and not the other, or in another order)."""
    names = tuple(e.name for e in VERDICT_CATALOGUE)
    if names != get_args(Verdict):
        raise TypeError(f"VERDICT_CATALOGUE {names} must list Verdict's names {get_args(Verdict)}, in order")
    timing = {e.name for e in VERDICT_CATALOGUE if e.kind != "problem"}
    if timing != set(get_args(TimingVerdict)):
        raise TypeError(
            f"TimingVerdict {get_args(TimingVerdict)} must be the verdicts of no problem kind {timing}"
        )


_check_catalogue()

DeviceType = Literal["cpu", "cuda"]
JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
# Flags that travel with every number; their meaning is ``kernelab.service.judge.verdicts.FLAG_NOTES``.
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
# The types every inbound schema uses: bounds, text, timestamps, JSON objects, finite numbers
# --------------------------------------------------------------------------------------------------

MAX_INT_VALUE = 2**63 - 1
"""Largest magnitude of an integer parameter value, sweep value or seed: int64, the widest integer
that torch (tensor shapes, ``torch.Generator.manual_seed``), numpy and both databases hold. A
benchmark's own ``Params`` narrows its parameters further (``kernelab.kernels.base.MAX_INT_PARAM``, int32)."""
MAX_INT32 = 2**31 - 1
"""Largest value of an INTEGER column (int4 on PostgreSQL; SQLite's integers are 64-bit): every
id, and every count or index a request carries into a column of that type."""

STORED: dict[str, Any] = {"stored": True}
"""Validation context for data read back from the database (``JobSpec.model_validate(row.spec,
context=STORED)``): the bounds a newer version applies at the door (``at_door``) are not applied
again to what an older version stored, so nothing stored makes a later read fail; everything a
stored value needs to be used (types, finiteness) is still checked."""


def at_door(info: ValidationInfo | None) -> bool:
    """True unless ``info``'s context is ``STORED``: a door-only bound applies."""
    return not (info is not None and isinstance(info.context, dict) and info.context.get("stored"))


_LENGTH_KEYWORD = {"string": "maxLength", "array": "maxItems", "object": "maxProperties"}


@dataclass(frozen=True, slots=True)
class AtDoor:
    """A bound applied at the door and shown in the JSON Schema (so in the OpenAPI document), but
    not to data read back with ``STORED`` (``at_door``): what an older version stored under looser
    bounds still reads. Written in the type, ``Annotated[Text, AtDoor(max_length=200)]``,
    ``Annotated[int, AtDoor(ge=0, le=MAX_INT32)]``, ``Annotated[list[X], AtDoor(max_length=64)]``.

    ``max_length``: characters of a str, items of a list, keys of a dict, checked on the input before
    its items are validated (JSON Schema ``maxLength`` / ``maxItems`` / ``maxProperties``);
    ``ge``/``le``: an integer's range (``minimum`` / ``maximum``). Errors have pydantic's own types
    (``string_too_long``, ``too_long``, ``greater_than_equal``, ``less_than_equal``), so a 422 reads
    as for a built-in constraint and its ``loc`` names the field."""

    max_length: int | None = None
    ge: int | None = None
    le: int | None = None

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.with_info_wrap_validator_function(self._validate, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = handler(schema)
        target = handler.resolve_ref_schema(out)
        keyword = _LENGTH_KEYWORD.get(str(target.get("type")))
        if self.max_length is not None and keyword is not None:
            target[keyword] = self.max_length
        if self.ge is not None:
            target["minimum"] = self.ge
        if self.le is not None:
            target["maximum"] = self.le
        return out

    def _validate(self, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        door = at_door(info)
        if door and self.max_length is not None and isinstance(value, str | list | tuple | dict):
            if len(value) > self.max_length:
                raise _too_long(value, self.max_length)
        out = handler(value)
        if door and isinstance(out, int) and not isinstance(out, bool):
            if self.ge is not None and out < self.ge:
                raise PydanticCustomError(
                    "greater_than_equal", "Input should be greater than or equal to {ge}", {"ge": self.ge}
                )
            if self.le is not None and out > self.le:
                raise PydanticCustomError(
                    "less_than_equal", "Input should be less than or equal to {le}", {"le": self.le}
                )
        return out


def _too_long(value: str | list[Any] | tuple[Any, ...] | dict[Any, Any], limit: int) -> PydanticCustomError:
    if isinstance(value, str):
        return PydanticCustomError(
            "string_too_long", "String should have at most {max_length} characters", {"max_length": limit}
        )
    what = "Dictionary" if isinstance(value, dict) else "List"
    return PydanticCustomError(
        "too_long",
        "{what} should have at most {max_length} items, not {actual_length}",
        {"what": what, "max_length": limit, "actual_length": len(value)},
    )


Int64 = Annotated[int, AtDoor(ge=-MAX_INT_VALUE, le=MAX_INT_VALUE)]
"""An integer that int64 holds (a JSON number stored in a JSON document, read by numpy and torch)."""
Size64 = Annotated[int, AtDoor(ge=0, le=MAX_INT_VALUE)]
"""A count, size or offset >= 0 that int64 holds (bytes, elements, instructions, a BIGINT column)."""
Positive64 = Annotated[int, AtDoor(ge=1, le=MAX_INT_VALUE)]
"""An integer >= 1 that int64 holds (launches, matrix dimensions)."""
Count32 = Annotated[int, AtDoor(ge=0, le=MAX_INT32)]
"""A count or index >= 0 that an INTEGER column holds (``MAX_INT32``)."""
RowId = Annotated[int, AtDoor(ge=1, le=MAX_INT32)]
"""The id of a row (a job, a bisect, a token): primary keys are INTEGER columns (``MAX_INT32``)."""


TEXT_MAX_CHARS = 1_000_000
"""Longest inbound text field, characters (fields with a column of their own have tighter bounds)."""

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable_text(value: str) -> str:
    """``value`` when both databases can store it: no U+0000 (PostgreSQL's text and JSON types
    cannot hold it) and no lone surrogate (U+D800..U+DFFF: UTF-8 cannot encode one, so neither
    database driver, nor a JSON answer, can carry it; a JSON ``"\\ud800"`` escape and bytes that
    are not UTF-8, decoded by the door with ``surrogateescape``, arrive as one). Raises
    ``ValueError`` naming the character's position and code point, never quoting it."""
    bad = _UNSTORABLE.search(value)
    if bad is None:
        return value
    if bad.group() == "\x00":
        raise ValueError("text cannot contain the NUL character (U+0000)")
    raise ValueError(
        f"text must be UTF-8: character {bad.start()} is U+{ord(bad.group()):04X}, a lone surrogate "
        "(a JSON \\u escape of half a pair, or bytes that are not UTF-8)"
    )


Text = Annotated[str, StringConstraints(max_length=TEXT_MAX_CHARS), AfterValidator(storable_text)]
"""Inbound text: a str of at most ``TEXT_MAX_CHARS`` characters that both databases can store
(``storable_text``: no U+0000, no lone surrogate). Refusing it here makes the answer a 422 whose
``loc`` names the field, the same on both databases, instead of a database (or encoding) error
that names none. A field with a tighter bound writes it beside the type:
``Annotated[Text, AtDoor(max_length=200)]`` (a ``Field(max_length=...)`` given as the default
does not take: pydantic keeps the annotation's own ``max_length``)."""


ShortText = Annotated[Text, AtDoor(max_length=64)]
"""A code, dtype, timer, backend or probe name: at most 64 characters (the 64-character columns
``results.timer`` and ``history_points.timer`` take a timer)."""
Name = Annotated[Text, AtDoor(max_length=200)]
"""A name, a label, a version string or a mapping's key: at most 200 characters (``jobs.name``,
``tokens.name``, ``runners.name`` are 200-character columns)."""
Hostname = Annotated[Text, Field(min_length=1), AtDoor(max_length=255)]
"""A node's name: 1 to 255 characters (a DNS name's limit, RFC 1035; the ``node_name`` columns)."""
Message = Annotated[Text, AtDoor(max_length=2_000)]
"""One message for a person: at most 2,000 characters."""
ErrorText = Annotated[Text, AtDoor(max_length=100_000)]
"""An error or a check's report from a runner (a traceback, a tail of output): at most 100,000
characters (``kernelab.runners.redact`` cuts a job's failure to 6,000)."""
MAX_LIST_ITEMS = 64
"""Most items of a short list (names, notes, flags) and keys of a small mapping in a request."""


def _storable_tree(value: Any) -> str | None:
    """What makes ``value`` (a str, or dicts/lists of them, keys included) unstorable, or None."""
    if isinstance(value, str):
        try:
            storable_text(value)
        except ValueError as exc:
            return str(exc)
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            problem = _storable_tree(k) or _storable_tree(v)
            if problem:
                return problem
    elif isinstance(value, list | tuple):
        for v in value:
            problem = _storable_tree(v)
            if problem:
                return problem
    return None


def _json_safe(value: dict[str, Any]) -> dict[str, Any]:
    problem = _storable_tree(value)
    if problem:
        raise ValueError(problem)
    if not _finite_tree(value):
        raise ValueError("numbers must be finite (no NaN or Infinity)")
    if _int_out_of_range(value):
        raise ValueError(f"integers must be within +-{MAX_INT_VALUE} (int64)")
    return value


def _finite_tree(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite_tree(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_finite_tree(v) for v in value)
    return True


def _int_out_of_range(value: Any) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) > MAX_INT_VALUE
    if isinstance(value, dict):
        return any(_int_out_of_range(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_int_out_of_range(v) for v in value)
    return False


MAX_JSON_OBJECT_KEYS = 64
"""Most keys of a free-form inbound JSON object (an NVML process entry has four)."""
JsonObject = Annotated[dict[Text, Any], AtDoor(max_length=MAX_JSON_OBJECT_KEYS), AfterValidator(_json_safe)]
"""An inbound free-form JSON object (e.g. an NVML process entry): at most ``MAX_JSON_OBJECT_KEYS``
keys, keys and nested text storable (``storable_text``), nested numbers finite, nested integers
within int64."""


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


def _int64(value: Any, info: ValidationInfo) -> Any:
    if (
        at_door(info)
        and isinstance(value, int)
        and not isinstance(value, bool)
        and abs(value) > MAX_INT_VALUE
    ):
        raise ValueError(f"an integer must be within +-{MAX_INT_VALUE} (int64)")
    return value


MAX_PARAM_TEXT_CHARS = 1_000
"""Longest text parameter value (a dtype, a mode, a layout name)."""
_ParamInt = Annotated[
    int, WithJsonSchema({"type": "integer", "minimum": -MAX_INT_VALUE, "maximum": MAX_INT_VALUE})
]
ParamValue = Annotated[
    _ParamInt | Finite | Annotated[Text, AtDoor(max_length=MAX_PARAM_TEXT_CHARS)] | bool,
    AfterValidator(_int64),
]
"""One parameter value: an integer within int64 (``MAX_INT_VALUE``: a larger one would be refused
only on the runner, by every cell; checked on the union, so 2**63 is never read as a float), a
finite float, text of at most ``MAX_PARAM_TEXT_CHARS`` characters or a boolean."""


class _Strict(BaseModel):
    """Base for inbound schemas a person writes (specs, requests): unknown fields are an error that
    names the field; numbers are finite. Text fields are ``Text`` (storable, bounded)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _Posted(BaseModel):
    """Base for what a runner posts (results, probe reports, workload results): every float is
    finite (NaN/Infinity: 422 naming the field), and a field the server does not know is a 422
    naming it (``extra_forbidden``), as in samples (``Sample``, ``SampleColumns``): a ``"unit":
    "ms"`` the server ignored would leave every number 1000x wrong, with nothing said.

    A runner newer than its server that writes a new field bumps the document's ``schema_version``
    (``RESULT_SCHEMA_VERSION``, ``WORKLOAD_SCHEMA_VERSION``), which an older server refuses by name
    (``schema_version_newer``); the runner keeps such a document in its spool's ``rejected/``
    folder with the server's answer. Data read back from the database is read with
    ``read_stored`` (unknown fields of an older version are dropped there, not refused)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _stored_lists_to_bound(cls, data: Any, info: ValidationInfo) -> Any:
        """Read back (``STORED``), a list longer than its field's ``AtDoor`` bound (stored before
        the bound) is read up to the bound: a page that reads it costs what the door admits."""
        if at_door(info) or not isinstance(data, dict):
            return data
        over = {
            k: data[k][:n]
            for k, n in _list_bounds(cls).items()
            if isinstance(data.get(k), list) and len(data[k]) > n
        }
        return {**data, **over} if over else data


@functools.cache
def _list_bounds(model: type[BaseModel]) -> dict[str, int]:
    """``model``'s list fields with an ``AtDoor`` length: field name -> most items."""
    out = {}
    for name, field in model.model_fields.items():
        bounds = [m.max_length for m in field.metadata if isinstance(m, AtDoor) and m.max_length is not None]
        if bounds and get_origin(field.annotation) is list:
            out[name] = min(bounds)
    return out


class _Answer(BaseModel):
    """Base for what the server computes and answers (a workload's comparison, a gang seat): every
    float is finite; a field this version does not know is ignored, so an older client reads a newer
    server's answer (it is never posted: the door's refusal of unknown fields is ``_Posted``'s)."""

    model_config = ConfigDict(allow_inf_nan=False)


def read_stored(model: type[M], data: Any) -> M:
    """``model`` of ``data`` read back from the database: ``STORED`` (the door's newer bounds are
    not applied again) and unknown fields dropped (a field an older version wrote and this one no
    longer has). Raises ``pydantic.ValidationError`` for data no version could have stored."""
    return model.model_validate(data, context=STORED, extra="ignore")


# --------------------------------------------------------------------------------------------------
