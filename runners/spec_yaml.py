"""A YAML reader for spec files that bounds aliases, nesting and expansion.

YAML aliases make a small file stand for a huge tree: nine aliases of nine aliases, seven levels
deep, is a 1 KB file of 9**7 = 4.8 million paths, and every walk of the tree (the duplicate-key
check, pydantic's validation) follows all of them. ``compose`` reads the file into PyYAML's node
graph with ``BoundedLoader`` (a ``yaml.SafeLoader`` that counts aliases and depth as it composes)
and then sizes the graph as a tree *without* walking it as one (each shared node is sized once),
so a bomb is refused in time linear in the file. A node that contains itself (``&a [*a]``) is
refused too. Each refusal is a ``YAMLLimitError`` with the line it concerns.

Limits (a real spec has a handful of aliases, nesting of 4 and a few thousand nodes: at most
``MAX_CELLS`` sweep values per grid, three grids):

* ``MAX_ALIASES`` aliases (``*name``) in the file;
* ``MAX_DEPTH`` levels of nested collections (PyYAML composes recursively: a 5,000-deep ``[[[...``
  would otherwise end in a ``RecursionError``);
* ``MAX_EXPANDED_NODES`` nodes in the tree with every alias expanded;
* ``MAX_NUMBER_CHARS`` characters in a scalar read as an int, a float or a timestamp (plain or
  with an explicit ``!!int``/``!!float``/``!!timestamp`` tag). Turning text into a number can cost
  more than linear time: YAML 1.1's base-60 ints (``1:59:59``, which YAML 1.2 dropped) are summed
  as ever larger integers (a 900 KB ``seed: 1:59:59:...`` took 15 s), and a long decimal is
  quadratic where Python's ``int_max_str_digits`` guard is off. 100 is four times the longest
  float ``repr`` (24 characters, ``-2.2250738585072014e-308``) and five times a 64-bit int's 20
  digits, room for ``_`` separators; a longer one is refused, whatever its base, at its line.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_ALIASES = 256
MAX_DEPTH = 64
MAX_EXPANDED_NODES = 100_000
MAX_NUMBER_CHARS = 100
_NUMERIC_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("int", "float", "timestamp"))


class YAMLLimitError(Exception):
    """A spec file exceeds a bound of this module. ``line`` is 1-based, ``loc`` the top-level key the
    problem is under ("" when none)."""

    def __init__(self, message: str, line: int | None, loc: str = ""):
        super().__init__(message)
        self.line = line
        self.loc = loc


class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses more than ``MAX_ALIASES`` aliases and collections nested
    deeper than ``MAX_DEPTH`` while it composes (``YAMLLimitError`` at the offending line)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # PyYAML's hook, untyped there
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise YAMLLimitError(
                    f"more than {MAX_ALIASES} YAML aliases (*{event.anchor}); write the values out",
                    event.start_mark.line + 1,
                )
            return super().compose_node(parent, index)
        if isinstance(event, yaml.CollectionStartEvent):
            self._depth += 1
            if self._depth > MAX_DEPTH:
                raise YAMLLimitError(
                    f"collections nested more than {MAX_DEPTH} deep", event.start_mark.line + 1
                )
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1
        return super().compose_node(parent, index)

    def construct_object(self, node: Any, deep: bool = False) -> Any:  # PyYAML's hook
        """PyYAML's, refusing a number or timestamp scalar longer than ``MAX_NUMBER_CHARS``, and
        with a plain error of a constructor (``!!int "x"``: ``ValueError``; ``!!bool maybe``:
        ``KeyError``; ``!!timestamp x``: ``AttributeError``) turned into a ``ConstructorError`` at
        the node's line."""
        if (
            isinstance(node, yaml.ScalarNode)
            and node.tag in _NUMERIC_TAGS
            and len(node.value) > MAX_NUMBER_CHARS
        ):
            kind = node.tag.rsplit(":", 1)[-1]
            raise yaml.constructor.ConstructorError(
                None, None,
                f"a {len(node.value)}-character {kind} (at most {MAX_NUMBER_CHARS}): write it out shorter",
                node.start_mark,
            )  # fmt: skip
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, LookupError, AttributeError) as exc:
            raise yaml.constructor.ConstructorError(None, None, str(exc), node.start_mark) from exc


def compose(text: str) -> tuple[yaml.Node | None, BoundedLoader]:
    """The node graph of the single document in ``text`` (None for an empty one) and the loader
    that composed it (``loader.construct_document(node)`` builds the Python data from the same
    graph, without reading the text again).

    Raises ``yaml.YAMLError`` for a syntax error (PyYAML's, with its mark) and ``YAMLLimitError``
    for too many aliases, too deep a nesting, a self-containing node or more than
    ``MAX_EXPANDED_NODES`` expanded nodes.
    """
    loader = BoundedLoader(text)
    try:
        root = loader.get_single_node()
    finally:
        loader.dispose()
    if root is not None:
        _check_expansion(root)
    return root, loader


def _check_expansion(root: yaml.Node) -> None:
    """Raise ``YAMLLimitError`` when ``root`` expanded as a tree exceeds ``MAX_EXPANDED_NODES``
    nodes or ``MAX_DEPTH`` levels, or contains itself. The line is the top-level key whose value
    crosses a bound (an anchor's graph no longer knows where its aliases were), or the anchor's own
    line for one that contains itself."""
    seen: dict[int, tuple[int, int]] = {}
    if not isinstance(root, yaml.MappingNode):
        if _measure(root, seen, set(), 0)[0] > MAX_EXPANDED_NODES:
            raise YAMLLimitError(_TOO_MANY, root.start_mark.line + 1)
        return
    total = 1
    for key, value in root.value:
        where, name = key.start_mark.line + 1, str(key.value)
        try:
            total += _measure(key, seen, set(), 1)[0] + _measure(value, seen, set(), 1)[0]
        except YAMLLimitError as exc:
            raise YAMLLimitError(str(exc), exc.line if str(exc) == _CYCLE else where, name) from None
        if total > MAX_EXPANDED_NODES:
            raise YAMLLimitError(_TOO_MANY, where, name)


_CYCLE = "a YAML anchor contains an alias of itself"
_TOO_DEEP = f"collections nested more than {MAX_DEPTH} deep once the aliases are expanded"
_TOO_MANY = f"the YAML expands to more than {MAX_EXPANDED_NODES} nodes through its aliases"


def _measure(
    node: yaml.Node, seen: dict[int, tuple[int, int]], path: set[int], depth: int
) -> tuple[int, int]:
    """``(nodes, height)`` of ``node``'s expanded tree, nodes capped just above the bound; each
    shared node is measured once (``seen``, by identity). ``path`` holds the collections being
    measured, to find a cycle; ``depth`` is the node's level, refused beyond ``MAX_DEPTH`` (so this
    recursion stays shallow however the aliases chain)."""
    if depth > MAX_DEPTH:
        raise YAMLLimitError(_TOO_DEEP, node.start_mark.line + 1)
    key = id(node)
    if key in path:
        raise YAMLLimitError(_CYCLE, node.start_mark.line + 1)
    if key not in seen:
        nodes, height = 1, 0
        if isinstance(node, yaml.MappingNode | yaml.SequenceNode):
            path.add(key)
            mapping = isinstance(node, yaml.MappingNode)
            children = [c for kv in node.value for c in kv] if mapping else node.value
            for child in children:
                n, h = _measure(child, seen, path, depth + 1)
                nodes, height = min(nodes + n, MAX_EXPANDED_NODES + 1), max(height, h + 1)
            path.discard(key)
        seen[key] = (nodes, height)
    nodes, height = seen[key]
    if depth + height > MAX_DEPTH:
        raise YAMLLimitError(_TOO_DEEP, node.start_mark.line + 1)
    return nodes, height
