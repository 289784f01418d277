"""``kernelab.runners.specfile``: YAML that expands (alias bombs), nests or constructs badly is an error at
its line, found in time linear in the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelab.runners import spec_yaml
from kernelab.runners.specfile import SpecFileError, parse_spec

HEAD = "benchmark: softmax\nbaseline: {variant: torch}\ncandidate: {variant: triton}\n"
PATH = Path("bomb.yaml")


def _bomb(levels: int, width: int = 9) -> str:
    """``levels`` anchors, each a list of ``width`` aliases of the one before (width**levels paths,
    about 40 bytes a level), the last one used as a parameter value."""
    lines = [f"  - &a0 [{', '.join(['1'] * width)}]"]
    lines += [f"  - &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return HEAD + "_anchors:\n" + "\n".join(lines) + f"\nparams: {{p: *a{levels - 1}}}\n"


def _problems(text: str) -> list[tuple[int | None, str, str]]:
    with pytest.raises(SpecFileError) as info:
        parse_spec(text, PATH, check_benchmark=False)
    return [(p.line, p.loc, p.message) for p in info.value.problems]


@pytest.mark.parametrize("levels", [7, 9])
def test_alias_bombs_are_refused_at_their_line(levels: int) -> None:
    text = _bomb(levels)
    assert len(text) < 1000
    [(line, loc, message)] = _problems(text)
    assert "expands to more than" in message and str(spec_yaml.MAX_EXPANDED_NODES) in message
    assert (line, loc) == (4, "_anchors")  # the top-level key whose value crosses the bound


def test_small_anchors_still_work() -> None:
    side = "baseline: &side {variant: torch, params: {BLOCK: 1}}"
    text = HEAD.replace("baseline: {variant: torch}", side)
    text += "sweep: &grid {M: [8, 16]}\nsweep_by_device: {cpu: *grid}\n"
    text = text.replace("candidate: {variant: triton}", "candidate: *side")
    spec = parse_spec(text, PATH, check_benchmark=False)
    assert spec.candidate.params == {"BLOCK": 1} and spec.sweep_by_device["cpu"] == {"M": [8, 16]}


def test_too_many_aliases_name_the_line_of_the_first_one_over() -> None:
    n = spec_yaml.MAX_ALIASES + 1
    text = HEAD + "name: &n x\n" + "".join(f"k{i}: *n\n" for i in range(n))
    [(line, _, message)] = _problems(text)
    assert line == 4 + n and f"more than {spec_yaml.MAX_ALIASES} YAML aliases (*n)" in message


def test_an_anchor_that_contains_itself_is_an_error_not_a_recursion() -> None:
    [(line, loc, message)] = _problems(HEAD + "name: x\nparams: &p {a: [1, *p]}\n")
    assert (line, loc) == (5, "params") and "contains an alias of itself" in message


@pytest.mark.parametrize("depth", [spec_yaml.MAX_DEPTH + 1, 5000])
def test_deep_nesting_is_an_error_not_a_recursion(depth: int) -> None:
    [(line, _, message)] = _problems(HEAD + "params: {p: " + "[" * depth + "]" * depth + "}\n")
    assert line == 4 and f"nested more than {spec_yaml.MAX_DEPTH} deep" in message


def test_aliases_that_nest_deep_once_expanded_are_an_error() -> None:
    lines = ["x0: &x0 " + "[" * 10 + "1" + "]" * 10]
    lines += [f"x{i}: &x{i} " + "[" * 10 + f"*x{i - 1}" + "]" * 10 for i in range(1, 8)]
    [(line, loc, message)] = _problems(HEAD + "\n".join(lines) + "\n")
    assert (line, loc) == (10, "x6") and "once the aliases are expanded" in message  # x6: 71 levels


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("!!python/object/apply:os.system [echo]", "could not determine a constructor"),
        ("{[1]: 2}", "found unhashable key"),
        ('!!int "x"', "invalid literal for int()"),
    ],
)
def test_values_pyyaml_cannot_construct_are_errors_at_their_line(value: str, fragment: str) -> None:
    [(line, _, message)] = _problems(HEAD + f"name: x\nparams: {{p: {value}}}\n")
    assert line == 5 and fragment in message


def _sexagesimal(groups: int) -> str:
    return "1" + ":59" * groups


@pytest.mark.parametrize("value", [
    _sexagesimal(300_000),  # YAML 1.1 base 60: summed as ever larger ints (15 s on main)
    "1" * 200_000,  # decimal: quadratic where int_max_str_digits is off
    "0x" + "f" * 200_000,
    "1." + "5" * 200_000,
    f"!!int '{_sexagesimal(300_000)}'",  # an explicit tag is resolved the same way
    "2001-12-14 21:59:43." + "1" * 200_000,  # timestamp
])  # fmt: skip
def test_a_number_too_long_to_read_cheaply_is_refused_at_its_line(value: str) -> None:
    import time

    start = time.process_time()
    [(line, _, message)] = _problems(HEAD + f"name: x\nmeasurement:\n  seed: {value}\n")
    assert time.process_time() - start < 2.0
    assert line == 6 and f"(at most {spec_yaml.MAX_NUMBER_CHARS})" in message


def test_numbers_up_to_the_bound_are_read() -> None:
    spec = parse_spec(HEAD + "measurement: {seed: 1_000_000_007}\nname: x\n", PATH, check_benchmark=False)
    assert spec.measurement.seed == 1_000_000_007
    assert len("-2.2250738585072014e-308") < spec_yaml.MAX_NUMBER_CHARS


@pytest.mark.parametrize("value", ["!!bool maybe", "!!timestamp x"])
def test_tagged_values_of_the_wrong_form_are_errors_at_their_line(value: str) -> None:
    [(line, _, message)] = _problems(HEAD + f"name: x\nparams: {{p: {value}}}\n")
    assert line == 5 and message.startswith("cannot read a value")
