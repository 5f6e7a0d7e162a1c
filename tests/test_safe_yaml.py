"""The bounded YAML loader (toolkit.safe_yaml) against PyYAML itself as the oracle, and every
door that reads YAML refusing an alias bomb in bounded time, naming the file and the limit."""

from __future__ import annotations

import time

import pytest
import yaml
from conftest import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit import config as config_lib
from toolkit import safe_yaml
from toolkit.launching import sweep as sweeps
from toolkit.runs.rundir import RunDir


def bomb(levels: int = 9, fan: int = 9) -> str:
    """Billion laughs: ``fan ** levels`` values in a few hundred bytes."""
    lines = ["name: bomb", "a0: &a0 [" + ", ".join(["x"] * fan) + "]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * fan) + "]")
    return "\n".join(lines) + f"\nseed: *a{levels}\n"


def flow_bomb(levels: int = 9, fan: int = 9) -> str:
    """The same bomb on one line, as a ``--set`` value or a form field takes it."""
    parts = ["&a0 [" + ", ".join(["x"] * fan) + "]"]
    parts += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * fan) + "]" for i in range(1, levels + 1)]
    return "[" + ", ".join(parts) + "]"


plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=40,
)


@settings(max_examples=150, deadline=None)
@given(plain)
def test_a_document_inside_the_limits_loads_as_pyyaml_loads_it(value):
    text = yaml.safe_dump(value)
    assert safe_yaml.load(text) == yaml.safe_load(text)


def test_shared_anchors_load_and_count_as_aliases():
    text = "x: &a {k: v}\ny: {z: *a}\nw: [*a, *a]\nv: [&b 1, *b]\n"
    assert safe_yaml.load(text) == yaml.safe_load(text)
    many = "a: &a 1\nb: [" + ", ".join(["*a"] * (safe_yaml.MAX_ALIASES + 1)) + "]\n"
    with pytest.raises(
        safe_yaml.YamlLimitError, match=f"more than {safe_yaml.MAX_ALIASES} aliases"
    ):
        safe_yaml.load(many, "many.yaml")


BOUNDED_S = 10.0
"""What "refused fast" allows: far above the 0.002-0.15 s a refusal takes here (the deepest
document the most), so a loaded machine cannot fail it, and far below the minutes an
unbounded expansion or parse would take."""


@pytest.mark.parametrize(
    "text, limit",
    [
        (bomb(), "expands to more than 100,000 values"),
        (bomb(levels=30, fan=2), "expands to more than 100,000 values"),
        ("[" * 70 + "]" * 70, "nested deeper than the limit of 64"),
        ("[" * 5000 + "]" * 5000, "nested deeper than the limit of 64"),
        ("&a [*a]", "an alias inside its own anchor"),
        ("x: " + "y" * (safe_yaml.MAX_BYTES + 1), "over the limit of 1,048,576"),
    ],
    ids=["billion laughs", "binary bomb", "deep", "very deep", "recursive", "too large"],
)
def test_each_limit_is_named_and_refused_fast(text, limit):
    started = time.perf_counter()
    with pytest.raises(safe_yaml.YamlLimitError, match=limit) as refused:
        safe_yaml.load(text, "doc.yaml")
    assert time.perf_counter() - started < BOUNDED_S
    assert str(refused.value).startswith("doc.yaml: ") and len(str(refused.value)) < 300


def nested(kind: str, depth: int) -> str:
    """A document of ``depth`` collections, each inside the last: flow sequences, or block
    mappings with a scalar at the bottom (which counts as one more level)."""
    if kind == "sequences":
        return "[" * depth + "]" * depth
    return "".join("  " * i + "k:\n" for i in range(depth - 1)) + "  " * (depth - 1) + "k: 1\n"


@pytest.mark.parametrize("kind", ["sequences", "mappings"])
def test_the_depth_limit_is_exact_and_pyyaml_agrees_below_it(kind):
    depth = safe_yaml.MAX_DEPTH if kind == "sequences" else safe_yaml.MAX_DEPTH - 1
    text = nested(kind, depth)
    assert safe_yaml.load(text) == yaml.safe_load(text)
    with pytest.raises(safe_yaml.YamlLimitError, match="nested deeper than the limit of 64"):
        safe_yaml.load(nested(kind, depth + 1))


def test_a_malformed_document_is_named_without_echoing_it():
    with pytest.raises(safe_yaml.YamlError, match="^x.yaml: not valid YAML") as refused:
        safe_yaml.load("a: [" + "b, " * 10_000, "x.yaml")
    assert len(str(refused.value)) < 400
    with pytest.raises(safe_yaml.YamlError, match="not valid YAML"):
        safe_yaml.load("!!python/object/apply:os.system [echo]", "tag.yaml")


def test_short_cuts_long_input():
    assert safe_yaml.short("ab") == "'ab'"
    cut = safe_yaml.short("z" * 10_000)
    assert len(cut) < 260 and cut.endswith("(10,002 characters)")


@pytest.fixture
def bomb_file(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb())
    return path


def test_every_door_refuses_the_bomb_in_bounded_time(bomb_file, tmp_path, monkeypatch):
    started = time.perf_counter()
    with pytest.raises(config_lib.ConfigError, match="bomb.yaml: expands to more than"):
        config_lib.load(bomb_file)
    with pytest.raises(config_lib.ConfigError, match="expands to more than"):
        config_lib.from_yaml(bomb_file.read_text(), source="pasted")
    with pytest.raises(config_lib.ConfigError, match="override 'seed': expands to more than"):
        config_lib.load("experiments/quickstart.yaml", ["seed=" + flow_bomb()])
    with pytest.raises(config_lib.ConfigError, match="override 'seed': nested deeper"):
        config_lib.load("experiments/quickstart.yaml", ["seed=" + "[" * 100 + "]" * 100])
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(bomb())
    with pytest.raises(sweeps.SweepError, match="sweep.yaml: expands to more than"):
        sweeps.load(sweep)
    base = tmp_path / "with-base.yaml"
    base.write_text(f"name: s\nbase: {bomb_file}\ngrid: {{epochs: [1, 2]}}\n")
    with pytest.raises(sweeps.SweepError, match="base .*bomb.yaml: expands to more than"):
        sweeps.load(base)
    run = RunDir.create(tmp_path / "runs", "stored", config_lib.from_mapping({"name": "stored"}))
    run.config_path.write_text(bomb())  # a run directory's config, read back by every reader
    with pytest.raises(config_lib.ConfigError, match="config.yaml: expands to more than"):
        run.config()
    run.config_path.write_bytes(b"seed: 1\n" * (safe_yaml.MAX_BYTES // 8 + 1))
    with pytest.raises(OSError, match="larger than the limit"):
        run.config()
    assert time.perf_counter() - started < 10


def test_the_cli_refuses_the_bomb_with_exit_2_naming_the_file(bomb_file, tmp_path):
    started = time.perf_counter()
    result = run_cli(["launch", str(bomb_file)], tmp_path / "runs")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"{bomb_file}: expands to more than 100,000 values" in result.stderr
    assert time.perf_counter() - started < 30  # the interpreter's start included
    assert not (tmp_path / "runs").exists()


def test_a_field_error_quotes_a_long_value_cut_short():
    with pytest.raises(config_lib.ConfigError) as refused:
        config_lib.from_mapping({"name": "n" * 50_000})
    assert len(str(refused.value)) < 600 and "characters)" in str(refused.value)


def test_a_grid_whose_product_is_huge_is_refused_before_any_cell_is_built():
    grid = {f"optimizer.params.p{i}": list(range(10)) for i in range(8)}  # 10**8 cells
    started = time.perf_counter()
    with pytest.raises(sweeps.SweepError, match="100,000,000 cells, over the limit of 10,000"):
        sweeps.from_mapping({"name": "huge", "base": {"name": "b"}, "grid": grid})
    assert time.perf_counter() - started < BOUNDED_S
