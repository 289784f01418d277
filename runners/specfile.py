"""Read a job spec file (YAML or JSON) and report every problem as ``FILE:LINE: field: message``.

A user who mistypes a key in a 60-line spec should be told the line, not shown a traceback.
The file is composed into a YAML node tree first (JSON is YAML 1.2's flow subset, and PyYAML
reads the JSON specs kernelab writes), so every pydantic error ``loc`` — and every
``kernelab.kernels.validate_spec`` ``loc`` — is mapped back to the line of the key it names:

* syntax errors use the ``yaml.Mark`` of the scanner/parser (``problem_mark``);
* duplicate keys (which PyYAML would silently collapse) are errors at the second key's line;
* an unknown field points at its own key, a missing field at the mapping that lacks it;
* aliases, nesting and the size of the tree with its aliases expanded are bounded
  (``kernelab.runners.spec_yaml``), so a 1 KB alias bomb is refused at its line in microseconds;
* a value PyYAML cannot construct (an unknown ``!!tag``, a mapping used as a key) is an error at
  its line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kernelab.runners import spec_yaml
from kernelab.service.contract.schemas import JobSpec, WorkloadSpec, is_workload


@dataclass(frozen=True)
class SpecProblem:
    """One problem in a spec file: 1-based ``line`` (None: the whole file), field path, message."""

    line: int | None
    loc: str
    message: str


class SpecFileError(Exception):
    """A spec file cannot be read, parsed or validated. ``problems`` lists each one with its line."""

    def __init__(self, path: Path, problems: Sequence[SpecProblem]):
        self.path = Path(path)
        self.problems = list(problems)
        super().__init__(self.render())

    def render(self) -> str:
        """One ``FILE:LINE: field: message`` line per problem."""
        lines = []
        for p in self.problems:
            where = f"{self.path}:{p.line}" if p.line is not None else str(self.path)
            lines.append(f"{where}: {p.loc}: {p.message}" if p.loc else f"{where}: {p.message}")
        return "\n".join(lines)


def load_spec(path: Path, *, check_benchmark: bool = True) -> JobSpec:
    """Load and validate the ``JobSpec`` in ``path`` (YAML or JSON).

    With ``check_benchmark`` the spec is also checked against its benchmark
    (``kernelab.kernels.validate_spec``: known benchmark and variants, valid parameters in every cell).
    Raises ``SpecFileError`` naming the file and line of every problem found.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecFileError(path, [SpecProblem(None, "", f"cannot read: {exc}")]) from exc
    return parse_spec(text, path, check_benchmark=check_benchmark)


def parse_spec(text: str, path: Path, *, check_benchmark: bool = True) -> JobSpec:
    """Validate spec ``text``; ``path`` is only used in messages. See ``load_spec``."""
    root, data = _document(text, path)
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        problems = [_problem(root, err["loc"], err["msg"], err["type"]) for err in exc.errors()]
        raise SpecFileError(path, problems) from None
    if check_benchmark:
        from kernelab.kernels import validate_spec

        errors = validate_spec(spec)
        if errors:
            raise SpecFileError(path, [_problem(root, e["loc"], e["msg"], e["type"]) for e in errors])
    return spec


def load_any_spec(path: Path, *, check_benchmark: bool = True) -> JobSpec | WorkloadSpec:
    """``load_spec``, or the ``WorkloadSpec`` when the file says ``kind: workload`` (its problems
    reported the same way, ``FILE:LINE: field: message``; nothing of the workload is imported)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecFileError(path, [SpecProblem(None, "", f"cannot read: {exc}")]) from exc
    root, data = _document(text, path)
    if not is_workload(data):
        return parse_spec(text, path, check_benchmark=check_benchmark)
    try:
        return WorkloadSpec.model_validate(data)
    except ValidationError as exc:
        problems = [_problem(root, err["loc"], err["msg"], err["type"]) for err in exc.errors()]
        raise SpecFileError(path, problems) from None


def _document(text: str, path: Path) -> tuple[yaml.MappingNode, Any]:
    """The spec's YAML node tree and its decoded data; ``SpecFileError`` for any problem of form."""
    try:
        root, loader = spec_yaml.compose(text)
    except spec_yaml.YAMLLimitError as exc:
        raise SpecFileError(path, [SpecProblem(exc.line, exc.loc, str(exc))]) from None
    except yaml.YAMLError as exc:
        raise SpecFileError(path, [_yaml_problem(exc, "not valid YAML/JSON")]) from None
    if root is None:
        raise SpecFileError(path, [SpecProblem(None, "", "the file is empty; a job spec is a mapping")])
    if not isinstance(root, yaml.MappingNode):
        raise SpecFileError(path, [SpecProblem(root.start_mark.line + 1, "", "a job spec must be a mapping")])
    duplicates = list(_duplicate_keys(root, (), set()))
    if duplicates:
        raise SpecFileError(path, duplicates)
    try:
        data = loader.construct_document(root)
    except (yaml.YAMLError, ValueError, TypeError) as exc:  # e.g. !!int "x", an unhashable key
        raise SpecFileError(path, [_yaml_problem(exc, "cannot read a value")]) from None
    return root, data


def _yaml_problem(exc: Exception, what: str) -> SpecProblem:
    """A PyYAML error as one problem at the line of its mark (None when it has none)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        detail = " ".join(str(s) for s in (exc.context, exc.problem) if s)
        return SpecProblem(mark.line + 1 if mark is not None else None, "", f"{what}: {detail}")
    return SpecProblem(None, "", f"{what}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")


def _duplicate_keys(node: yaml.Node, loc: tuple[str, ...], walked: set[int]) -> Any:
    """Problems for keys repeated in a mapping of ``node``'s graph; a node shared through aliases is
    walked once (``walked``, by identity), so the walk is linear in the file."""
    if id(node) in walked:
        return
    walked.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            name = str(key.value)
            if name in seen:
                yield SpecProblem(key.start_mark.line + 1, ".".join((*loc, name)), "duplicate key")
            seen.add(name)
            yield from _duplicate_keys(value, (*loc, name), walked)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _duplicate_keys(item, (*loc, str(i)), walked)


def _problem(root: yaml.Node, loc: Sequence[Any], msg: str, err_type: str) -> SpecProblem:
    line = line_of(root, loc)
    fields = ".".join(str(p) for p in loc if p != "[key]")
    if err_type == "extra_forbidden":
        msg = f"unknown field {str(loc[-1])!r}" if loc else msg
    return SpecProblem(line, fields, msg)


def line_of(root: yaml.Node, loc: Sequence[Any]) -> int:
    """1-based line of the deepest node of ``root`` that the pydantic ``loc`` reaches.

    Walks mapping keys by name and sequences by index; stops at the first part that is not in
    the tree (a missing field, a union branch name such as ``'int'``), so a missing field points at
    the key of the mapping that lacks it (line 1 for the top level).
    """
    node = root
    line = root.start_mark.line + 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if str(k.value) == str(part)), None)
            if match is None:
                break
            line = match[0].start_mark.line + 1
            node = match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line
