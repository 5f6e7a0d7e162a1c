"""``python -m toolkit``: launch, list, stop and resume runs.

python -m toolkit launch CONFIG [--np N] [--hosts h1:2,h2:2 | auto | --hostfile F]
                          [--min-np M --max-np X --discovery HOSTS_FILE_OR_SCRIPT]
                          [--slurm [--nodes K] [--partition P] [--time T] [--account A]
                           [--gpus-per-task G] [--sbatch-arg ARG ...]]
                          [--set k=v ...] [--tag T ...] [--note TEXT] [--wait]
python -m toolkit runs [--all] [--tag T ...] [--search TEXT]
python -m toolkit show RUN
python -m toolkit tag RUN [TAG ...] [--remove TAG ...]
python -m toolkit note RUN [TEXT | -]
python -m toolkit stop RUN
python -m toolkit resume RUN [--wait]
python -m toolkit delete RUN
python -m toolkit probe CONFIG [--np N] [--steps K] [--set k=v ...]
python -m toolkit calibrate CONFIG [--batches B ...] [--rates F ...] [--epochs E] [--seeds S ...]
                           [--targets LOSS ...] [--set k=v ...] [--dry-run | --yes]
python -m toolkit sweep SWEEP [--dry-run | --status] [--max-parallel K] [--retry-failed] [--csv F]
                       [--slurm [--nodes K] [--time T] ...]   (the cells as one Slurm job array)
python -m toolkit search SEARCH [--dry-run | --status] [--max-parallel K] [--csv F]
                        [--slurm [--nodes K] [--time T] ...]   (each trial a Slurm job)
python -m toolkit queue [--capacity h1:2,h2:2 | --capacity default]
python -m toolkit notebook [JUPYTERLAB ARGS]   (toolkit.launching.jupyter)
python -m toolkit cluster up [--hosts N] [--slurm] [--bandwidth 1gbit] [--delay 100us]
python -m toolkit cluster status | shape [--bandwidth R] [--delay D] | down
python -m toolkit cluster exec HOST -- COMMAND...
python -m toolkit tensorboard [RUN ...] [--logdir DIR] [--no-serve] [--port P]
python -m toolkit export mlflow [RUN ...] [--tracking-uri URI] [--experiment NAME]

Every user error (a bad config, an unknown or invalid run id, a run that is busy or in the wrong
state, run files that cannot be written) exits with status 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import warnings
from pathlib import Path

import pandas as pd

from toolkit import advice, safe_yaml, terminal
from toolkit.config import MAX_WORKERS
from toolkit.flags import integer, positive
from toolkit.launching import cluster, cluster_slurm, jupyter, slots
from toolkit.launching import launch as launcher
from toolkit.launching import probe as probe_lib
from toolkit.launching.cluster import ClusterError
from toolkit.launching.executors import registry
from toolkit.runs import checkpoints, placement
from toolkit.runs.monitor import follow
from toolkit.runs.rundir import LIVE, complete_id, list_runs, resolve, runs_root
from toolkit.runs.states import State
from toolkit.runs.table import outcome_text, summary
from toolkit.words import counted

RUN_HELP = "the run's id (toolkit runs lists them)"
SET_HELP = "override one config field, as YAML: --set optimizer.params.momentum=0.95 (repeatable)"


class Parser(argparse.ArgumentParser):
    """argparse, its messages cut short where they quote an argument (its subcommands too)."""

    def error(self, message: str):
        super().error(safe_yaml.clip(message))


def build_parser() -> Parser:
    """The command line: every command, its arguments and their checks."""
    summary_line = __doc__.splitlines()[0].replace("``", "")
    parser = Parser(prog="python -m toolkit", description=summary_line)
    parser.add_argument(
        "--runs", help="runs root (default $LBL_RUNS, else ./runs here; ./lab: the repository's)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("launch", help="validate a config and start it under horovodrun")
    start.add_argument("config", help="the experiment's YAML file (experiments/*.yaml)")
    start.add_argument(
        "--np", type=integer(1, MAX_WORKERS), help="number of workers (default: the config's)"
    )
    start.add_argument("--hosts", help="name:slots,... or auto (Slurm); default localhost:NP")
    start.add_argument("--hostfile", help="horovodrun's hostfile: 'name slots=N' per line")
    start.add_argument(
        "--min-np", type=integer(1, MAX_WORKERS), help="elastic: fewest workers (min_workers)"
    )
    start.add_argument(
        "--max-np", type=integer(1, MAX_WORKERS), help="elastic: most workers (max_workers)"
    )
    start.add_argument(
        "--discovery", help="elastic: hosts file (host:slots lines) or discovery script"
    )
    registry.add_arguments(start)
    start.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=SET_HELP)
    start.add_argument("--name", help="run id (default <name>-b<batch>-<optimizer>-<hex>)")
    start.add_argument("--tag", action="append", default=[], help="tag the run (repeatable)")
    start.add_argument("--note", help="the run's notes")
    start.add_argument("--wait", action="store_true", help="wait until the run ends")
    listing = sub.add_parser("runs", help="list runs (probe runs with --all)")
    listing.add_argument("--all", action="store_true", help="probe runs too")
    listing.add_argument("--tag", action="append", default=[], help="only runs with this tag")
    listing.add_argument("--search", help="only runs whose id, tags or notes contain this")
    sub.add_parser("show", help="one run in full: state, why, where, resumes").add_argument(
        "run", help=RUN_HELP
    )
    tag = sub.add_parser("tag", help="add tags to a run (or --remove them); list them")
    tag.add_argument("run", help=RUN_HELP)
    tag.add_argument("tags", nargs="*", metavar="TAG", help="tags to add (none: list them)")
    tag.add_argument(
        "--remove", action="append", default=[], metavar="TAG", help="a tag to take off"
    )
    note = sub.add_parser("note", help="show a run's notes, or replace them with TEXT")
    note.add_argument("run", help=RUN_HELP)
    note.add_argument("text", nargs="?", help="the new notes ('-': read them from stdin)")
    sub.add_parser("stop", help="stop a run").add_argument("run", help=RUN_HELP)
    cont = sub.add_parser("resume", help="continue a run from its last checkpoint")
    cont.add_argument("run", help=RUN_HELP)
    cont.add_argument("--wait", action="store_true", help="wait until the run ends")
    delete = sub.add_parser("delete", help="delete an ended run's directory")
    delete.add_argument("run", help=RUN_HELP)
    probe = sub.add_parser("probe", help="what batch should I use? (the gradient noise scale)")
    probe.add_argument("config", help="the experiment's YAML file to probe")
    probe.add_argument(
        "--np", type=integer(1, MAX_WORKERS), default=1, help="workers (default 1, here)"
    )
    probe.add_argument(
        "--steps", type=integer(1, probe_lib.MAX_PROBE_STEPS), default=200, help="updates"
    )
    probe.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=SET_HELP)
    calibrate = sub.add_parser(
        "calibrate", help="measure the critical batch on a config (a sweep of short runs)"
    )
    calibrate.add_argument("config", help="the experiment's YAML file to calibrate")
    calibrate.add_argument(
        "--batches", type=integer(1), nargs="+", help="global batches (default: 1/4x to 16x its)"
    )
    calibrate.add_argument(
        "--rates", type=positive, nargs="+", help="factors of each batch's scaled rate (0.5 1 2)"
    )
    calibrate.add_argument(
        "--epochs",
        type=integer(1),
        help="passes over the data at the config's batch (default: its epochs, at most 5)",
    )
    calibrate.add_argument("--seeds", type=int, nargs="+", help="default: the config's seed")
    calibrate.add_argument(
        "--targets", type=positive, nargs="+", help="held-out losses (default: what all reach)"
    )
    calibrate.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=SET_HELP)
    calibrate.add_argument("--max-parallel", type=integer(1), help="runs at a time (default: fit)")
    asked = calibrate.add_mutually_exclusive_group()
    asked.add_argument("--dry-run", action="store_true", help="print the runs and cost only")
    asked.add_argument("--yes", action="store_true", help="start without asking")
    grid = sub.add_parser("sweep", help="run a grid of experiments (toolkit.launching.sweep)")
    grid.add_argument("sweep", help="the sweep's YAML file (sweeps.md)")
    shown = grid.add_mutually_exclusive_group()
    shown.add_argument("--dry-run", action="store_true", help="print the cells, start nothing")
    shown.add_argument("--status", action="store_true", help="print each cell's state and results")
    grid.add_argument("--max-parallel", type=integer(1), help="cells at a time (default: fit)")
    grid.add_argument("--retry-failed", action="store_true", help="rerun failed/stopped cells")
    grid.add_argument("--csv", help="write the per-cell results table here")
    registry.add_arguments(grid)
    search = sub.add_parser("search", help="search a config's space with Optuna (sweeps.md)")
    search.add_argument("search", help="the search's YAML file")
    shown = search.add_mutually_exclusive_group()
    shown.add_argument("--dry-run", action="store_true", help="print the space, start nothing")
    shown.add_argument("--status", action="store_true", help="print each trial so far")
    search.add_argument("--max-parallel", type=integer(1), help="trials at a time (default: fit)")
    search.add_argument("--csv", help="write the trials table here")
    registry.add_arguments(search)
    queue = sub.add_parser("queue", help="the launch queue: capacity, running and waiting runs")
    queue.add_argument("--capacity", help="set the slots: name:slots,... or 'default'")
    sub.add_parser(
        "notebook", help="JupyterLab on 127.0.0.1 in notebooks/; other arguments go to it"
    )
    _cluster_parser(sub.add_parser("cluster", help="a test cluster of namespace hosts"))
    board = sub.add_parser("tensorboard", help="runs' events for TensorBoard, and serve them")
    board.add_argument("run_ids", nargs="*", metavar="RUN", help="default: every run but probes")
    board.add_argument("--logdir", help="the export's home (default: tensorboard/ beside the runs)")
    board.add_argument("--no-serve", action="store_true", help="export, then exit")
    board.add_argument("--port", type=integer(1, 65535), default=6006, help="on 127.0.0.1")
    export = sub.add_parser("export", help="runs into another tracker (MLflow)")
    targets = export.add_subparsers(dest="target", required=True, metavar="TARGET")
    to_mlflow = targets.add_parser("mlflow", help="each run one MLflow run; again: the rest")
    to_mlflow.add_argument(
        "run_ids", nargs="*", metavar="RUN", help="default: every run but probes"
    )
    to_mlflow.add_argument(
        "--tracking-uri", help="an MLflow server or database (default: <runs>/.mlflow/mlflow.db)"
    )
    to_mlflow.add_argument(
        "--experiment", help="the MLflow experiment (default: each config's name)"
    )
    return parser


def _show_warning(otherwise, message, category, *args, **kwargs) -> None:
    """A :class:`~toolkit.advice.ConfigWarning` as one ``warning: ...`` line on stderr; any
    other warning as ``otherwise`` shows it."""
    if issubclass(category, advice.ConfigWarning):
        print(f"warning: {message}", file=sys.stderr)
    else:
        otherwise(message, category, *args, **kwargs)


def main(argv: list[str] | None = None) -> int:
    """The CLI; :class:`~toolkit.advice.ConfigWarning` shows as ``warning: ...`` meanwhile, and
    a reader that stops reading (``runs | head``) ends it quietly."""
    with warnings.catch_warnings():
        warnings.showwarning = functools.partial(_show_warning, warnings.showwarning)
        try:
            code = _command(argv)
            sys.stdout.flush()  # a reader gone (`runs | head`) shows here, not at exit
        except BrokenPipeError:  # it has what it wanted: end quietly, as `cat` would
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        return code


def _command(argv: list[str] | None) -> int:
    parser = build_parser()
    args, passed_on = parser.parse_known_args(argv)
    if passed_on and args.command != "notebook":
        parser.error(f"unrecognized arguments: {' '.join(passed_on)}")
    args.passed_on = passed_on
    try:
        if getattr(args, "run", None):  # typed: its unique start will do
            args.run = complete_id(args.run, args.runs)
        return COMMANDS[args.command](args) or 0
    except BrokenPipeError:  # not the command's error: the reader of its output left
        raise
    except (ValueError, OSError, ClusterError) as error:  # ConfigError, RunError: ValueErrors
        print(f"error: {safe_yaml.clip(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        went_on = (
            "the runs launched so far go on; the same command resumes the sweep"
            if args.command in ("sweep", "calibrate", "search")
            else "the run goes on"
        )
        print(f"\ninterrupted; {went_on} (`python -m toolkit stop RUN`)", file=sys.stderr)
        return 130


def _launch(args) -> int | None:
    run = launcher.launch(
        args.config,
        np=args.np,
        hosts=args.hosts,
        hostfile=args.hostfile,
        overrides=args.set,
        runs_root_dir=args.runs,
        run_id=args.name,
        tags=args.tag,
        notes=args.note,
        min_np=args.min_np,
        max_np=args.max_np,
        discovery=args.discovery,
        place=registry.asked(args),
    )
    print(f"launched {run.run_id} in {run.path} (output: {run.stdout_path})")
    status = run.recorded_status()
    print(
        f"where: {placement.where(status)}"
        + (f"; {status['reason']}" if status.get("reason") else "")
    )
    if place := slots.positions(args.runs).get(run.run_id):
        print(f"queued: number {place} in line for slots (python -m toolkit queue)")
    return _wait(run) if args.wait else None


def _runs(args) -> None:
    print(terminal.runs_table(args.runs, probes=args.all, tags=args.tag, search=args.search))


def _tag(args) -> None:
    print(", ".join(resolve(args.run, args.runs).set_tags(args.tags, args.remove)))


def _note(args) -> None:
    run = resolve(args.run, args.runs)
    if args.text is not None:
        run.set_notes(sys.stdin.read().rstrip("\n") if args.text == "-" else args.text)
    print(run.notes())


def _stop(args) -> None:
    was = resolve(args.run, args.runs).status()["state"]
    run = launcher.stop(args.run, args.runs, by="the CLI")
    ended = f"{run.run_id} had already ended ({was}): nothing to stop"
    print(f"{run.run_id}: {run.status()['state']}" if was in LIVE else ended)


def _resume(args) -> int | None:
    run = launcher.resume(args.run, args.runs)
    print(f"resumed {run.run_id} {checkpoints.resumed_text(run.recorded_status())}")
    return _wait(run, resumed=True) if args.wait else None


def _delete(args) -> None:
    launcher.delete(args.run, args.runs)
    print(f"deleted {args.run}")


def _notebook(args) -> None:
    if args.runs:
        os.environ["LBL_RUNS"] = args.runs
    jupyter.main(args.passed_on)


def _probe(args) -> None:
    from toolkit.config import load

    config = load(args.config, args.set)
    print(f"probing {config.name}: {args.steps} updates on {args.np} worker(s)...")
    result = probe_lib.probe(config, steps=args.steps, np=args.np, runs_root=args.runs)
    print(f"{result.reading()}\n(probe run: {result.run_id})")


def _exported_runs(args):
    """The runs an export names (``args.run_ids``, completed), else a function listing every
    run but probes each time it is called (a served export's runs grow)."""
    named = [resolve(complete_id(run_id, args.runs), args.runs) for run_id in args.run_ids]

    def runs() -> list:
        return named or [run for run in list_runs(args.runs) if not run.meta().get("probe")]

    return runs


def _tensorboard(args) -> int:
    """Export the named runs (or every run but probes, listed again each round while serving)
    under the logdir, then serve them with TensorBoard on 127.0.0.1 until interrupted."""
    from toolkit.runs import tensorboard_export

    runs = _exported_runs(args)
    logdir = Path(args.logdir or runs_root(args.runs).resolve().parent / "tensorboard")
    for run_id, count in tensorboard_export.export_all(runs(), logdir).items():
        print(f"{run_id}: {count} new records")
    print(f"exported to {logdir}")
    if args.no_serve:
        return 0
    print(f"TensorBoard on http://127.0.0.1:{args.port}/ (Ctrl-C stops it)", flush=True)
    try:
        return tensorboard_export.serve(runs, logdir, args.port)
    except KeyboardInterrupt:
        return 0


def _export(args) -> None:
    """``export mlflow``: each run brought up to date in MLflow, a line each."""
    from toolkit.runs import mlflow_export

    runs = _exported_runs(args)()
    said = mlflow_export.export_runs(runs, args.tracking_uri, args.experiment, args.runs)
    print("\n".join(said))


def _sweep(args) -> int:
    """``sweep``: the plan, the state, or the run; the aggregate over seeds at the end."""
    from toolkit.launching import sweep, sweep_results, sweep_runner

    grid = sweep_runner.placed(sweep.load(args.sweep), registry.asked(args))
    if args.dry_run:
        _print_plan(grid, args.runs, args.max_parallel)
        return 0
    if args.status:
        table = sweep_results.results(grid, args.runs)
    else:
        table = sweep_runner.run(
            grid,
            args.runs,
            max_parallel=args.max_parallel,
            retry_failed=args.retry_failed,
            log=lambda line: print(line, flush=True),
        )
    print(terminal.frame_text(table))
    metrics = ("final_test_accuracy", "best_test_accuracy", "updates")
    print(
        "\nover seeds:\n"
        + sweep_results.aggregate(table, metrics).map(terminal.cell).to_string(index=False)
    )
    if args.csv:
        table.to_csv(args.csv, index=False)
        print(f"wrote {args.csv}")
    return 0 if (table["state"] == State.COMPLETED).all() else 1


def _search(args) -> int:
    """``search``: the space, the trials so far, or the search run to its end; the best."""
    from toolkit.launching import search, search_runner

    found = search.placed(search.load(args.search), registry.asked(args))
    if args.dry_run:
        search_runner.check_runnable(found, args.runs)
        print(found.space_text())
        return 0
    if args.status:
        table = search_runner.trials(found, args.runs)
    else:
        log = functools.partial(print, flush=True)
        table = search_runner.run(found, args.runs, max_parallel=args.max_parallel, log=log)
    if table.empty:
        print(f"no trial of search {found.name} asked yet under {runs_root(args.runs).resolve()}")
    else:
        print(terminal.frame_text(table))
    if unfollowed := search_runner.unfollowed(table, found.name, args.runs):
        print(f"warning: {unfollowed}", file=sys.stderr)
    if (table["state"] == "completed").any():
        best = search_runner.best(found, args.runs)
        print(
            f"\nbest: trial {best.trial} ({best.run_id}), {found.spec.objective.metric} "
            f"{best.value:.4f}"
        )
    if args.csv:
        table.to_csv(args.csv, index=False)
        print(f"wrote {args.csv}")
    return 0 if (table["state"] == "completed").any() else 1


def _print_plan(grid, root: str | None, max_parallel: int | None, shown=None) -> None:
    """A sweep's cells (as ``shown`` gives them), each with its estimated time and how it was
    priced, and the whole sweep's cost."""
    from toolkit.launching import sweep_runner

    print(f"sweep {grid.name}: {counted(len(grid.cells), 'cell')}")
    cells, startup = sweep_runner.dry_run(grid, root), sweep_runner.startup(root)
    estimated = sweep_runner.estimate(grid, cells, sweep_runner.throughputs(root), startup)
    table = cells.assign(estimated_s=estimated.seconds.round(), priced=estimated.basis)
    print((shown or (lambda c: c))(table).map(terminal.cell).to_string(index=False))
    parallel = max_parallel or sweep_runner.default_parallel(grid, root)
    print(sweep_runner.cost(estimated, cells, parallel, startup))


def _calibrate(args) -> int:
    """``calibrate``: the grid and its cost; with consent, the runs, the fit, kept for probes."""
    from toolkit.config import load
    from toolkit.launching import calibrate
    from toolkit.scaling import critical_batch

    config = load(args.config, args.set)
    grid = calibrate.grid(
        config,
        batches=args.batches,
        rate_factors=args.rates or calibrate.RATE_FACTORS,
        epochs=args.epochs,
        seeds=args.seeds,
    )
    if kept := critical_batch.stored(config, runs_root(args.runs)):
        print(f"kept for this task: {kept.reading()}")
    _print_plan(grid, args.runs, args.max_parallel, lambda c: calibrate.shown(c, config))
    if args.dry_run:
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            print("not started: pass --yes to start it at the cost above", file=sys.stderr)
            return 2
        if input("start it? [y/N] ").strip().lower() not in ("y", "yes"):
            return 1
    found = calibrate.calibrate(
        config,
        args.runs,
        sweep=grid,
        targets=args.targets,
        max_parallel=args.max_parallel,
        log=lambda line: print(line, flush=True),
    )
    print(f"\n{found.table()}\n\n{found.reading()}")
    print(f"kept for `python -m toolkit probe` on this task in {runs_root(args.runs)}")
    return 0


def _cluster_parser(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    make = actions.add_parser("up", help="make (or repair) the cluster")
    make.add_argument(
        "--hosts", type=integer(1, cluster.MAX_HOSTS), default=3, help="number of hosts (3)"
    )
    make.add_argument(
        "--slurm", action="store_true", help="also a Slurm controller and a slurmd per host"
    )
    for action in (make, actions.add_parser("shape", help="limit every host's link")):
        action.add_argument("--bandwidth", help="each host's link rate, tc units: 1gbit, 500mbit")
        action.add_argument("--delay", help="one-way delay, tc units: 100us (needs sch_netem)")
    actions.add_parser("status", help="each host: namespace, sshd, ssh, shaping, Slurm state")
    actions.add_parser("down", help="remove every namespace, process and file the cluster made")
    inside = actions.add_parser("exec", help="run a command inside a host")
    inside.add_argument("host", help="a cluster host's name (lbl-h1, ...)")
    inside.add_argument(
        "argv", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="what to run there"
    )


def _cluster(args) -> int:
    """``cluster``: up, shape, status, exec or down (see :mod:`toolkit.launching.cluster`)."""
    if args.action == "up":
        given = args.bandwidth or args.delay
        made = cluster.up(
            args.hosts, cluster.Shaping(args.bandwidth, args.delay) if given else None
        )
        if args.slurm:
            cluster_slurm.start(made)
        works = f"ssh {made[-1].name}" + (", sinfo, sbatch" if args.slurm else "")
        print(f"cluster up: {', '.join(h.name for h in made)} ({works} work)")
    elif args.action == "shape":
        cluster.shape(cluster.Shaping(args.bandwidth, args.delay))
    elif args.action == "down":
        cluster_slurm.stop()
        cluster.down()
        print("cluster down")
        return 0
    elif args.action == "exec":
        argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not argv:
            raise ClusterError("cluster exec HOST -- COMMAND: the command is missing")
        os.execvp("ip", cluster.exec_argv(args.host, argv))
    rows = cluster.status()
    if cluster_slurm.running():
        states = cluster_slurm.node_states()
        rows = [{**row, "slurm": states.get(row["host"], "-")} for row in rows]
    print(pd.DataFrame(rows).to_string(index=False) if rows else "no cluster is up")
    return 0


def _wait(run, resumed: bool = False) -> int:
    """Follow ``run`` with a progress bar (from its resumed step, if ``resumed``), then say how
    it went and where to look; exit code 0 if it completed."""
    status = follow(run, resumed=resumed)
    state, row = status["state"], summary(run)
    said = f"{run.run_id}: {state}"
    if state == State.COMPLETED:
        print(f"{said} · {outcome_text(row)}")
    else:
        print(f"{said}: {status.get('reason') or 'no reason recorded'}")
    print(f"  its files: {run.path} (stdout.log, events.jsonl, checkpoints/)")
    if os.environ.get("LBL_DASHBOARD_NEXT"):  # ./lab start's demo run: the dashboard is next
        print("  the dashboard starts next: its Runs, Run detail and Compare pages show it")
    else:
        print("  to compare: python -m toolkit runs, or ./lab start (Runs, Run detail, Compare)")
    return 0 if state == State.COMPLETED else 1


COMMANDS = {  # the subcommand -> its handler, which returns the exit code (None: 0)
    "launch": _launch,
    "runs": _runs,
    "show": lambda args: print(terminal.run_text(resolve(args.run, args.runs))),
    "tag": _tag,
    "note": _note,
    "stop": _stop,
    "resume": _resume,
    "delete": _delete,
    "sweep": _sweep,
    "search": _search,
    "calibrate": _calibrate,
    "queue": lambda args: print(terminal.queue_text(args.runs, args.capacity)),
    "notebook": _notebook,
    "cluster": _cluster,
    "tensorboard": _tensorboard,
    "export": _export,
    "probe": _probe,
}


if __name__ == "__main__":
    sys.exit(main())
