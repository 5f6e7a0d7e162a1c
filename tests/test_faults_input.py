"""Faults, class 6: config values and user errors. Every float field of the schema refuses
NaN and infinity, every number field refuses a boolean, constructor params refuse non-finite
values at any depth, and every user error of the CLI exits 2 with one line and no traceback."""

from __future__ import annotations

import typing

import pytest
from conftest import run_cli
from pydantic import BaseModel

from toolkit.config import ConfigError, ExperimentConfig, from_mapping
from toolkit.runs import processes
from toolkit.runs.rundir import RunDir


def leaf_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, object]]:
    """``(dotted path, annotation)`` of every non-section field of the schema."""
    found = []
    for name, field in model.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            found += leaf_fields(kind, f"{prefix}{name}.")
        else:
            found.append((f"{prefix}{name}", kind))
    return found


def has(annotation, kind) -> bool:
    return annotation is kind or kind in typing.get_args(annotation)


FLOAT_FIELDS = [path for path, kind in leaf_fields(ExperimentConfig) if has(kind, float)]
NUMBER_FIELDS = [path for path, kind in leaf_fields(ExperimentConfig) if has(kind, int)]


def test_the_schema_has_the_fields_this_suite_walks():
    assert {"optimizer.learning_rate", "schedule.warmup.epochs"} <= set(FLOAT_FIELDS)
    assert {"epochs", "seed", "batch.per_worker", "workers"} <= set(NUMBER_FIELDS)


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "'inf'", "'NaN'"])
@pytest.mark.parametrize("field", FLOAT_FIELDS)
def test_every_float_field_refuses_non_finite_values(field, value):
    with pytest.raises(ConfigError, match=rf"{field}: .*finite"):
        from_mapping({}, [f"{field}={value}"])


@pytest.mark.parametrize("value", ["true", "false", "yes"])
@pytest.mark.parametrize("field", FLOAT_FIELDS + NUMBER_FIELDS)
def test_every_number_field_refuses_a_boolean(field, value):
    with pytest.raises(ConfigError, match=rf"{field}: Input should not be a boolean"):
        from_mapping({}, [f"{field}={value}"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("optimizer.params.momentum=.inf", "optimizer.params: 'momentum' must be a finite"),
        ("optimizer.params.betas=[0.9, .nan]", "'betas'[1] must be a finite number"),
        ("schedule.params.decay_rate=-.inf", "schedule.params: 'decay_rate' must be a finite"),
        ("dataset.params.noise={a: {b: .nan}}", "'noise'.a.b must be a finite number"),
    ],
)
def test_params_refuse_non_finite_values_at_any_depth(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        from_mapping({}, [override])


def test_a_stored_config_that_is_empty_is_unreadable_not_the_defaults(tmp_path):
    run = RunDir.create(tmp_path, "hollow")
    run.config_path.write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        run.config()


@pytest.fixture(scope="module")
def user_runs(tmp_path_factory):
    """A runs root with a completed and a (fake) running run, a file, and a binary config."""
    root = tmp_path_factory.mktemp("runs")
    done = RunDir.create(root, "done", from_mapping({"name": "done"}))
    done.set_status("completed", exit_code=0)
    (done.checkpoints_path / "epoch-0001").mkdir(parents=True)
    live = RunDir.create(root, "live", from_mapping({"name": "live"}))
    live.set_status("running", processes=[processes.record("worker", pid=1)])  # pid 1 lives
    (root.parent / "binary.yaml").write_bytes(b"\xff\xfe\x00junk")
    (root.parent / "a-file").write_text("x")
    return root


QUICK = "experiments/quickstart.yaml"
USER_ERRORS = {
    "missing config": (["launch", "nope.yaml"], "does not exist"),
    "directory as config": (["launch", "experiments"], "does not exist"),
    "binary config": (["launch", "{root}/../binary.yaml"], "cannot be read as text"),
    "yaml tag in --set": (
        ["launch", QUICK, "--set", "seed=!!python/object/apply:os.system [echo pwned]"],
        "not a plain YAML value",
    ),
    "--set without =": (["launch", QUICK, "--set", "epochs"], "must look like section.field"),
    "--set into a value": (["launch", QUICK, "--set", "epochs.x=1"], "is not a section"),
    "--name ..": (["launch", QUICK, "--name", ".."], "run ids must not start with '.'"),
    "--name taken": (["launch", QUICK, "--name", "done"], "already exists"),
    "stop unknown": (["stop", "ghost"], "no run 'ghost'"),
    "stop ..": (["stop", ".."], "invalid run id '..'"),
    "resume completed": (["resume", "done"], "is completed"),
    "resume running": (["resume", "live"], "is running"),
    "resume without checkpoint": (["resume", "ghost"], "no run 'ghost'"),
    "delete running": (["delete", "live"], "stop it before deleting"),
    "delete ../x": (["delete", "../x"], "invalid run id"),
}


@pytest.mark.parametrize("case", USER_ERRORS, ids=list(USER_ERRORS))
def test_every_user_error_exits_2_with_one_line(case, user_runs, subprocess_env):
    args, message = USER_ERRORS[case]
    result = run_cli([a.format(root=user_runs) for a in args], user_runs, subprocess_env)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and message in result.stderr, result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert sorted(p.name for p in user_runs.iterdir()) == ["done", "live"]


@pytest.mark.parametrize(
    "override, said",
    [  # the fourth walk launched both: the seed failed in the workers, the epochs never end
        ("seed=-5", "seed: Input should be greater than or equal to 0 (got -5)"),
        ("seed=4294967296", "seed: Input should be less than or equal to 4294967295"),
        ("epochs=1000000000", "epochs: Input should be less than or equal to 100000"),
    ],
)
def test_a_value_the_workers_cannot_run_is_refused_before_anything_starts(
    override, said, user_runs, subprocess_env
):
    result = run_cli(["launch", QUICK, "--set", override], user_runs, subprocess_env)
    assert result.returncode == 2 and said in result.stderr, result.stderr
    assert sorted(p.name for p in user_runs.iterdir()) == ["done", "live"]


def test_a_runs_root_that_is_a_file_is_a_clean_error(user_runs, subprocess_env):
    result = run_cli(["launch", QUICK, "--name", "x"], user_runs.parent / "a-file", subprocess_env)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "cannot create run 'x'" in result.stderr
