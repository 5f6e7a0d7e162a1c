"""The one YAML loader every door uses: experiment configs, ``--set`` values, sweep files, run
configs read back, and what the app lets a user type or upload.

PyYAML's ``safe_load`` builds no objects but plain ones, yet it is not bounded: aliases share
nodes, so a 1.5 KB document of nested anchors ("billion laughs") parses in milliseconds and
expands to billions of values the moment anything walks it (validation, an error message, a
copy). Here a document is composed into PyYAML's node graph first and measured there, in time
linear in the text, before anything is built from it. It is refused, with
:class:`YamlLimitError` naming the source and the limit, when it has

- more than :data:`MAX_BYTES` characters,
- more than :data:`MAX_ALIASES` aliases,
- nesting deeper than :data:`MAX_DEPTH` collections,
- more than :data:`MAX_NODES` values once every alias is expanded, or
- an alias inside its own anchor (a recursive structure).

Real configs are far inside every limit: the study's largest sweep file is about 3 KB with no
alias, nesting depth 5 and under 500 values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from toolkit import files

MAX_BYTES = 1 << 20
MAX_ALIASES = 256
MAX_DEPTH = 64
MAX_NODES = 100_000
SHOWN = 200  # characters of an offending input an error message may quote


class YamlError(ValueError):
    """A document that is not valid YAML, or is over a limit; the message names its source and
    what is wrong (which limit), never the whole input."""


class YamlLimitError(YamlError):
    """A YAML document over one of the limits."""


def load(text: str, source: str = "YAML") -> Any:
    """The plain Python value of the YAML document ``text`` (``None`` if empty). Raises
    :class:`YamlLimitError` if it is over a limit, :class:`YamlError` if it is not valid YAML
    (one document, safe tags only); ``source`` names it in errors."""
    if len(text) > MAX_BYTES:
        raise YamlLimitError(f"{source}: {len(text):,} characters, over the limit of {MAX_BYTES:,}")
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _measure(node, source)
        return loader.construct_document(node)
    except yaml.YAMLError as error:
        said = " ".join(str(error).split())
        raise YamlError(f"{source}: not valid YAML: {said[:SHOWN]}") from None
    except _TooDeep:
        raise YamlLimitError(f"{source}: nested deeper than the limit of {MAX_DEPTH}") from None
    finally:
        loader.dispose()


class _TooDeep(Exception):
    pass


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, which stops composing at the first collection nested deeper than
    :data:`MAX_DEPTH`. PyYAML composes recursively: left alone, a deep document is refused only
    when Python's recursion limit is hit, and unwinding it took 1.7 s for ``"[" * 5000``. An
    alias is composed without descending into its anchor, so the depth reached through aliases
    is :func:`_measure`'s to check."""

    def __init__(self, text: str):
        super().__init__(text)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _TooDeep
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_file(path: str | Path) -> Any:
    """:func:`load` of the regular file at ``path`` (a FIFO or device is refused, never read),
    read no further than :data:`MAX_BYTES`. Raises ``OSError`` or ``UnicodeDecodeError`` where
    it cannot be read as text, and what :func:`load` raises."""
    return load(files.read_bytes(path, limit=MAX_BYTES, follow=True).decode(), str(path))


def clip(text: str, limit: int = 2 * SHOWN) -> str:
    """``text``, each line cut to ``limit`` characters: how a message that may hold a user's
    input is shown."""
    return "\n".join(
        line if len(line) <= limit else f"{line[:limit]}... ({len(line):,} characters)"
        for line in str(text).splitlines()
    )


def short(value: Any, limit: int = SHOWN) -> str:
    """``repr(value)``, cut to ``limit`` characters: how an error quotes a user's input."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def listed(names: list[str], most: int = 5) -> str:
    """The first ``most`` of ``names``, comma-separated, and how many more there are: how a
    message names some of many (``a, b, c and 4 more``)."""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def _measure(root: yaml.Node, source: str) -> None:
    """Refuse ``root``'s graph if it is over a limit, in one depth-first pass over its distinct
    nodes: each node's expanded size and depth is computed once, after its children's; a
    second edge to a node is an alias, and an edge to a node still open above is a cycle."""
    size: dict[int, int] = {}  # id(node) -> values under it, aliases expanded
    depth: dict[int, int] = {}
    pushed: set[int] = set()
    path: set[int] = set()  # the nodes open above the current one
    aliases = 0
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    pushed.add(id(root))
    while stack:
        node, closing = stack.pop()
        children = _children(node)
        if closing:
            path.discard(id(node))
            size[id(node)] = 1 + sum(size[id(c)] for c in children)
            depth[id(node)] = 1 + max((depth[id(c)] for c in children), default=0)
            if size[id(node)] > MAX_NODES:
                raise YamlLimitError(
                    f"{source}: expands to more than {MAX_NODES:,} values once its aliases "
                    "are expanded, over the limit"
                )
            if depth[id(node)] > MAX_DEPTH:
                raise YamlLimitError(f"{source}: nested deeper than the limit of {MAX_DEPTH}")
            continue
        path.add(id(node))
        stack.append((node, True))
        for child in reversed(children):  # popped in document order: an alias's anchor is done
            if id(child) in path:
                raise YamlLimitError(f"{source}: an alias inside its own anchor (recursive)")
            if id(child) in pushed:
                aliases += 1
                if aliases > MAX_ALIASES:
                    raise YamlLimitError(f"{source}: more than {MAX_ALIASES} aliases, the limit")
                continue
            pushed.add(id(child))
            stack.append((child, False))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []
