"""The README and docs/: every command line they show parses, every link lands.

Commands: each ``python -m toolkit ...`` line of a ``bash`` block (continuation lines joined,
comments cut) is parsed by the CLI's own parser, so its command and options exist and its
values pass their checks, and the presets it names exist. What the commands do is tested where
they are implemented. Python: each name a ``python`` block imports from the toolkit exists
(what the blocks do is what the notebooks, which the tests run, do). Links: each relative
link names a file in the repository, and each ``#anchor`` a heading of the page it points to.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from conftest import ROOT

from toolkit.__main__ import build_parser

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
COMMAND = re.compile(r"^(?:\.venv/bin/)?python -m toolkit (.*)$")


def shown_commands(page: Path) -> list[str]:
    """The ``python -m toolkit`` command lines of ``page``'s code blocks, continuations joined."""
    commands, in_code, pending = [], False, ""
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code, pending = not in_code, ""
            continue
        if not in_code:
            continue
        line = pending + line.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if match := COMMAND.match(line):
            commands.append(match.group(1))
    return commands


def headings(page: Path) -> set[str]:
    """GitHub's anchors for ``page``'s headings."""
    anchors, in_code = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (match := re.match(r"#{1,6} (.*)", line)):
            anchors.add(re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-"))
    return anchors


COMMANDS = [(page, command) for page in PAGES for command in shown_commands(page)]


def test_the_pages_show_commands():
    assert len(COMMANDS) >= 30
    assert {page.name for page, _ in COMMANDS} >= {"README.md", "runs.md", "sweeps.md"}


@pytest.mark.parametrize(
    "page, command", COMMANDS, ids=[f"{p.name}: {c[:60]}" for p, c in COMMANDS]
)
def test_every_command_shown_parses(page, command):
    argv = shlex.split(command, comments=True)
    args, passed_on = build_parser().parse_known_args(argv)
    assert not passed_on or args.command in ("notebook", "cluster"), passed_on
    for word in argv:
        if word.startswith("experiments/"):
            assert (ROOT / word).exists(), word


def imports_shown(page: Path) -> list[str]:
    """The ``from toolkit... import ...`` lines of ``page``'s ``python`` blocks (a line each; a
    block may elide code with ``...``, so each line runs alone)."""
    found, in_python = [], False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_python = line == "```python" and not in_python
        elif in_python and re.match(r"from toolkit[\w.]* import ", line):
            found.append(line)
    return found


IMPORTS = [(page, line) for page in PAGES for line in imports_shown(page)]


def test_the_pages_import_from_the_toolkit():
    assert {page.name for page, _ in IMPORTS} >= {"README.md", "runs.md"}


@pytest.mark.parametrize("page, line", IMPORTS, ids=[f"{p.name}: {li}" for p, li in IMPORTS])
def test_every_import_shown_resolves(page, line):
    exec(line, {})  # ImportError (a moved module or a renamed name) fails the test


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_lands(page):
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        landing = (page.parent / path).resolve() if path else page
        assert landing.exists(), f"{page.name}: {target}"
        if anchor:
            assert anchor in headings(landing), f"{page.name}: {target}"
