"""Hostile input, generated (hypothesis): every CLI command with valid, boundary, wrong-typed,
negative, huge, empty, unicode and path-like arguments; experiment configs and sweep files
mutated at every depth; and the app's pages given generated query parameters.

A command runs in this process through ``toolkit.__main__.main``, the code path of the real
command, up to the point where a process would start: the seams below (the executors' ``start``,
in-process ``train``, ``jupyter``'s exec, the cluster's changes, ``--wait``) raise
:class:`Started` instead. Every case must end with exit 0 or 2 (1 only where the command's own
contract says so), print no traceback, write nothing outside its temporary runs root and
working directory, and finish within :data:`BUDGET_S`.

Example counts are in :data:`EXAMPLES` (docs/notes/reliability.md reports them).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, dashboard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_safe_yaml import bomb

from toolkit import __main__ as cli
from toolkit import safe_yaml
from toolkit.config import ExperimentConfig
from toolkit.launching import cluster, jupyter, launch
from toolkit.launching.executors.local import LocalExecutor
from toolkit.launching.executors.slurm import SlurmExecutor
from toolkit.runs import tensorboard_export

BUDGET_S = 5.0
EXAMPLES = {"per command": 40, "configs": 100, "sweep files": 40, "query parameters": 15}
FUZZ = {  # CI draws the same examples every run (a red CI is a real bug, not a new draw)
    "deadline": None,
    "database": None,
    "derandomize": bool(os.environ.get("CI")),
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}
QUICKSTART = yaml.safe_load((ROOT / "experiments" / "quickstart.yaml").read_text())


class Started(Exception):
    """A process would have started here: validation is over."""


def would_start(*_, **__):
    raise Started


def populate(work: Path) -> None:
    """The files of every kind a path argument may name (again before each case: a case may
    write over one, as ``--csv sweep.yaml`` does)."""
    (work / "quick.yaml").write_text(yaml.safe_dump(QUICKSTART))
    (work / "binary.yaml").write_bytes(b"\xff\xfe\x00\x01")
    (work / "bomb.yaml").write_text(bomb())
    (work / "sweep.yaml").write_text(
        yaml.safe_dump({"name": "fz", "base": QUICKSTART, "grid": {"epochs": [1]}})
    )
    (work / "hosts.txt").write_text("localhost slots=2\n")
    (work / "a-dir").mkdir(exist_ok=True)
    if not (work / "fifo.yaml").exists():
        os.mkfifo(work / "fifo.yaml")


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """A working directory (see :func:`populate`) and a runs root beside it."""
    work = tmp_path_factory.mktemp("fuzz") / "work"
    work.mkdir()
    populate(work)
    return work, work.parent / "runs"


ANY_PATH = st.sampled_from(
    [
        "quick.yaml", "binary.yaml", "bomb.yaml", "sweep.yaml", "hosts.txt", "a-dir",
        "fifo.yaml", "missing.yaml", "", "-", ".", "..", "../../etc/passwd", "/dev/zero",
        "/", "ünïcödé.yaml", "x" * 300, "a\nb", str(ROOT / "experiments" / "quickstart.yaml"),
    ]
)  # fmt: skip
PATHS = st.one_of(st.sampled_from(["quick.yaml", "sweep.yaml"]), ANY_PATH)  # often a valid one
OUTPUTS = st.sampled_from(  # where a command writes: inside the working directory only
    ["out.csv", "quick.yaml", "a-dir", "fifo.yaml", "", "-", ".", "ünï.csv", "x" * 300]
)
NUMBERS = st.one_of(
    st.sampled_from(["0", "-1", "1", "2"]),
    st.integers(-3, 5).map(str),
    st.sampled_from(["0", "-1", "2", "1e9", "99999999999999999999", "nan", "inf", "1.5", "0x10"]),
    st.text(max_size=6),
)
RUN_IDS = st.one_of(
    st.sampled_from(["done", "live", "halted", "ghost", "..", ".", "/", "../runs", "a/b"]),
    st.text(max_size=70),
)
HOSTS = st.one_of(
    st.sampled_from(
        ["localhost:2", "auto", "h1:1,h2:1", "h:0", "h:-1", ":", ",", "h:99999999999", ""]
    ),
    st.text(max_size=30),
)
WORDS = st.text(max_size=12)
RUNS_OPTION = st.one_of(  # relative: inside the working directory
    st.just([]),
    st.sampled_from(["runs2", "quick.yaml", "a-dir", "fifo.yaml", "", "ünï", "a/../b"]).map(
        lambda root: ["--runs", root]
    ),
)
OVERRIDES = st.one_of(
    WORDS,
    st.sampled_from(
        [
            "seed=1", "epochs=-1", "workers=0", "batch.per_worker=1e9", "ssh_port=70000",
            "seed=[&a [1], *a]", "seed=" + "[" * 80 + "]" * 80, "x.y.z=1", "=1", "seed",
            "optimizer.learning_rate=.nan", "hosts=h:1", "seed=!!python/name:os.system",
        ]
    ),
)  # fmt: skip


def options(**choices) -> st.SearchStrategy[list[str]]:
    """Any subset of ``--name VALUE`` options (a value of ``None``: a flag), in any order."""
    pairs = [
        st.just([f"--{name}"]) if values is None else values.map(lambda v, n=name: [f"--{n}", v])
        for name, values in choices.items()
    ]
    return st.lists(st.one_of(*pairs), max_size=4).map(lambda parts: sum(parts, []))


COMMANDS = {
    "launch": st.tuples(PATHS, options(np=NUMBERS, hosts=HOSTS, hostfile=PATHS, name=RUN_IDS,
                                       set=OVERRIDES, wait=None, tag=WORDS, note=WORDS)),
    "runs": st.tuples(st.just(None), options(all=None, tag=WORDS, search=WORDS)),
    "tag": st.tuples(RUN_IDS, st.builds(
        lambda tags, removed: tags + removed, st.lists(WORDS, max_size=3), options(remove=WORDS)
    )),
    "note": st.tuples(RUN_IDS, st.lists(st.one_of(WORDS, st.just("-")), max_size=1)),
    "stop": st.tuples(RUN_IDS, st.just([])),
    "resume": st.tuples(RUN_IDS, options(wait=None)),
    "delete": st.tuples(RUN_IDS, st.just([])),
    "probe": st.tuples(PATHS, options(np=NUMBERS, steps=NUMBERS, set=OVERRIDES)),
    "sweep": st.tuples(PATHS, options(**{"dry-run": None, "status": None, "max-parallel": NUMBERS,
                                         "retry-failed": None, "csv": OUTPUTS})),
    "queue": st.tuples(st.just(None), options(capacity=HOSTS)),
    "notebook": st.tuples(st.just(None), st.lists(st.sampled_from(
        ["--port=8890", "--ip=0.0.0.0", "--no-browser", "--IdentityProvider.token=", "--x"]
    ), max_size=3)),
    "cluster": st.tuples(st.sampled_from(["up", "shape", "status", "exec", "down", "nope"]),
                         options(hosts=NUMBERS, bandwidth=WORDS, delay=WORDS)),
    "tensorboard": st.tuples(st.just(None), st.builds(
        lambda run_ids, rest: run_ids + rest, st.lists(RUN_IDS, max_size=2),
        options(logdir=OUTPUTS, port=NUMBERS, **{"no-serve": None}),
    )),
}  # fmt: skip


def outside_snapshot(work: Path) -> tuple:
    """What a case must not change: the repository's files and the folder around the
    sandbox."""
    tracked = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout
    return tracked, sorted(p.name for p in work.parent.parent.iterdir())


def run_command(argv: list[str], work: Path, runs: Path, monkeypatch) -> tuple[int, str]:
    """``python -m toolkit ARGV`` in this process, in ``work``, with the seams in place:
    (exit code, stdout + stderr); a command that got as far as starting a process is 0."""
    for target, name in (
        (LocalExecutor, "start"),
        (SlurmExecutor, "start"),
        (SlurmExecutor, "start_all"),
        (jupyter, "install_kernel"),
        (os, "execve"),
        (os, "execvp"),
        (cluster, "up"),
        (cluster, "down"),
        (cluster, "shape"),
        (cli, "_wait"),
        (tensorboard_export, "serve"),
    ):
        monkeypatch.setattr(target, name, would_start)
    monkeypatch.setattr("toolkit.train.train", would_start)
    populate(work)
    monkeypatch.chdir(work)
    monkeypatch.setenv("LBL_RUNS", str(runs))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 2
        except Started:
            code = 0
    return code, out.getvalue() + err.getvalue()


def check(argv, work, runs, monkeypatch, allowed=(0, 2)) -> int:
    before = outside_snapshot(work)
    started = time.perf_counter()
    code, said = run_command(argv, work, runs, monkeypatch)
    took = time.perf_counter() - started
    assert code in allowed, (argv, code, said[-2000:])
    assert "Traceback" not in said, (argv, said[-3000:])
    assert max(map(len, said.splitlines()), default=0) < 1000, (argv, said[:3000])  # cut short
    assert took < BUDGET_S, (argv, f"{took:.1f} s")
    assert outside_snapshot(work) == before, argv
    return code


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_survives_generated_arguments(command, sandbox):
    work, runs = sandbox
    from toolkit.config import from_mapping
    from toolkit.runs.rundir import RunDir

    for run_id, state in (("done", "completed"), ("live", "running"), ("halted", "stopped")):
        if not (runs / run_id).exists():
            run = RunDir.create(runs, run_id, from_mapping({"name": run_id}))
            run.set_status(state, processes=[] if state != "running" else None)

    @settings(
        max_examples=EXAMPLES["per command"],
        **FUZZ,
    )
    @given(RUNS_OPTION, COMMANDS[command])
    def case(runs_option, generated):
        first, rest = generated
        argv = [*runs_option, command, *([first] if first is not None else []), *rest]
        with pytest.MonkeyPatch.context() as monkeypatch:
            # sweep: 1 when a cell did not complete; everything else: 0 or 2
            check(
                argv, work, runs, monkeypatch, allowed=(0, 1, 2) if command == "sweep" else (0, 2)
            )

    case()


NUMERIC = [
    ("launch", "quick.yaml", "--np"),
    ("probe", "quick.yaml", "--np"),
    ("probe", "quick.yaml", "--steps"),
    ("sweep", "sweep.yaml", "--max-parallel"),
    ("cluster", "up", "--hosts"),
]
OUT_OF_RANGE = ["0", "-1", "1.5", "x", "", "99999999999999999999"]


@pytest.mark.parametrize("command, first, option", NUMERIC, ids=[" ".join(c) for c in NUMERIC])
def test_every_numeric_argument_is_range_checked_where_it_is_parsed(
    command, first, option, sandbox
):
    """Each boundary on its own, beside the generated cases: exit 2 naming the argument (a
    huge --max-parallel is a valid one, so that sweep goes on to start)."""
    work, runs = sandbox
    for value in OUT_OF_RANGE:
        with pytest.MonkeyPatch.context() as monkeypatch:
            code, said = run_command([command, first, option, value], work, runs, monkeypatch)
        if option == "--max-parallel" and value == OUT_OF_RANGE[-1]:
            assert code == 0, said
            continue
        assert code == 2 and "Traceback" not in said, (option, value, said)
        assert f"argument {option}" in said or option.lstrip("-") in said, said


# --- configs and sweep files, generated from the schema and mutated -------------------------


def paths_of(value, prefix=()) -> list[tuple]:
    """Every path to a value or section of a nested mapping, the empty path included."""
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += paths_of(child, (*prefix, key))
    return found


HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["1e400", "-0", "0x10", "NaN", "~", "🚀", "a" * 5000]),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)


@st.composite
def mutated(draw, base: dict) -> tuple[dict, str]:
    """``base`` with one path set to a hostile value, or an unknown key added there; and the
    YAML to write it as (plain, with every repeated value aliased, or nested deeply)."""
    config = yaml.safe_load(yaml.safe_dump(base))
    path = draw(st.sampled_from(paths_of(config)))
    node = config
    for key in path[:-1]:
        node = node[key]
    if path and draw(st.booleans()):
        node[path[-1]] = draw(HOSTILE)
    else:
        target = node[path[-1]] if path and isinstance(node[path[-1]], dict) else node
        target[draw(st.text(min_size=1, max_size=10))] = draw(HOSTILE)
    style = draw(st.sampled_from(["plain", "aliased", "deep"]))
    if style == "deep":
        depth = draw(st.integers(10, 200))
        config["name"] = yaml.safe_load("[" * depth + "]" * depth)
    text = yaml.safe_dump(config, allow_unicode=True)
    if style == "aliased":  # the whole config again through hundreds of aliases
        copies = draw(st.integers(2, 400))
        text = yaml.safe_dump({"base": config, "copies": [config] * copies}, allow_unicode=True)
        config = None  # unknown top-level keys: nothing the schema accepts
    return config, text


def schema_accepts(config) -> bool:
    try:
        ExperimentConfig.model_validate(config)
    except Exception:  # noqa: BLE001 (any refusal)
        return False
    return True


def check_document(text: str, argv: list[str], sandbox) -> int:
    """Write ``text`` to a file in the sandbox, then :func:`check` ``argv`` + its path."""
    work, runs = sandbox
    path = work / "mutated.yaml"
    path.write_text(text)
    with pytest.MonkeyPatch.context() as monkeypatch:
        return check([*argv, str(path)], work, runs, monkeypatch)


@settings(max_examples=EXAMPLES["configs"], **FUZZ)
@given(mutated(QUICKSTART))
def test_a_mutated_config_is_refused_unless_the_schema_accepts_it(sandbox, generated):
    config, text = generated
    if check_document(text, ["launch"], sandbox) == 0:
        assert config is not None and schema_accepts(config), text[:500]


SWEEP = {"name": "fz", "base": QUICKSTART, "grid": {"batch.per_worker": [16, 32]}, "seeds": [0]}


@settings(max_examples=EXAMPLES["sweep files"], **FUZZ)
@given(mutated(SWEEP))
def test_a_mutated_sweep_file_is_refused_or_planned_in_time(sandbox, generated):
    check_document(generated[1], ["sweep", "--dry-run"], sandbox)


# --- the app's query parameters -------------------------------------------------------------


@settings(max_examples=EXAMPLES["query parameters"], **FUZZ)
@given(
    st.sampled_from(["detail", "compare"]),
    st.lists(st.one_of(RUN_IDS, st.sampled_from(["<script>alert(1)</script>", "**b**", "%2e%2e"])),
             min_size=1, max_size=3),
)  # fmt: skip
def test_the_pages_take_any_query_parameters(app_runs, view, values):

    at = dashboard()
    at.query_params["run"] = values
    at.run()
    at.switch_page(f"views/{view}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    kept = at.query_params["run"]
    assert set([kept] if isinstance(kept, str) else kept) <= {"done"}  # only runs in the root
    shown = " ".join(str(e.value) for e in [*at.markdown, *at.caption, *at.error, *at.info])
    assert "<script>" not in shown


@pytest.fixture(scope="module")
def app_runs(tmp_path_factory):
    from fabricate import fake_run

    root = tmp_path_factory.mktemp("app-runs")
    fake_run(root, "done", events=50)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("LBL_RUNS", str(root))
        yield root


def test_the_budget_and_counts_are_what_the_docs_report():
    readme = (ROOT / "docs" / "notes" / "reliability.md").read_text()
    for name, count in EXAMPLES.items():
        assert f"{count} {name}" in readme or f"{name}: {count}" in readme, name
    assert math.isfinite(BUDGET_S) and f"{BUDGET_S:.0f} s" in readme
    assert safe_yaml.MAX_NODES and f"{safe_yaml.MAX_NODES:,}" in readme


def test_the_same_values_through_python_raise_the_modules_own_error(sandbox):
    from toolkit.config import ConfigError, from_mapping
    from toolkit.launching import probe, sweep_runner
    from toolkit.launching import sweep as sweeps

    work, runs = sandbox
    config = from_mapping(QUICKSTART)
    for bad in (0, -1, True, 1.5, probe.MAX_PROBE_STEPS + 1):
        with pytest.raises(ConfigError, match="probe: steps must be an integer from 1 to"):
            probe.probe(config, steps=bad, runs_root=runs)
    for bad in (0, -3, 2.0, 10**9):
        with pytest.raises(ConfigError, match="probe: np must be an integer"):
            probe.probe(config, np=bad, runs_root=runs)
    for bad in (0, -3, 10**9):
        with pytest.raises(ConfigError, match="workers"):
            launch.launch(config, np=bad, runs_root_dir=runs)
    grid = sweeps.load(work / "sweep.yaml")
    for bad in (0, -1, 1.5, True):
        with pytest.raises(sweeps.SweepError, match="max_parallel must be an integer >= 1"):
            sweep_runner.run(grid, runs, max_parallel=bad)
        with pytest.raises(sweeps.SweepError, match="max_parallel must be an integer >= 1"):
            sweep_runner.start(grid, runs, max_parallel=bad)
    for bad in (0, 51, "3"):
        with pytest.raises(cluster.ClusterError, match="--hosts must be between 1 and 50"):
            cluster.up(bad)


@pytest.mark.parametrize("value", [None, "high", [0.1], {"a": 1}])
def test_an_optimizer_parameter_of_the_wrong_type_is_a_config_error_naming_it(value):
    """What the fuzz found: such a value reached the constructor and ended in a TypeError."""
    from toolkit.config import ConfigError, from_mapping

    raw = {**QUICKSTART, "optimizer": {**QUICKSTART["optimizer"]}}
    raw["optimizer"]["params"] = {**raw["optimizer"]["params"], "trust_coefficient": value}
    with pytest.raises(ConfigError) as refused:
        from_mapping(raw)
    assert "trust_coefficient" in str(refused.value), str(refused.value)


@pytest.mark.parametrize("command", [None, *sorted(COMMANDS)])
def test_help_is_plain_text_for_every_command(command, sandbox):
    work, runs = sandbox
    argv = [command, "--help"] if command else ["--help"]
    with pytest.MonkeyPatch.context() as monkeypatch:
        code, said = run_command(argv, work, runs, monkeypatch)
    assert code == 0 and "usage: python -m toolkit" in said and "``" not in said, said
