"""The pre-flight probe: "what batch should I use?". It trains a config briefly, measuring the
gradient noise scale at every update (:mod:`toolkit.scaling.noise_scale`), and reads ``B_simple``,
its spread and a suggested batch off the measurements.

Its own module, above training: the probe needs :mod:`toolkit.train`, which needs the noise
scale's estimator through its callbacks, so the estimator stays below both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from toolkit.plan import RunPlan, Scale
from toolkit.runs.rundir import runs_root as runs_root_of
from toolkit.runs.states import State
from toolkit.scaling import critical_batch, noise_scale
from toolkit.scaling.critical_batch import Calibration

CALIBRATION = (4.355, 1.51, 10.86)
"""``B_crit / B_simple`` with ``B_simple`` read by this probe on its stated path (batch 64, SGD
at a tuned constant rate, 200 updates), the median and range of twelve measurements on four
tasks of three model families (``experiments/probe_protocol.py``, its ``factors.csv``;
docs/notes/study.md): on the MNIST-1D CNN with 16,000 examples 3.21, 4.27 and 5.10 at held-out
losses 1.0, 0.8 and 0.6, with 64,000 3.44, 4.80 and 5.31 at 0.5, 0.4 and 0.3; on the MNIST-1D
MLP 1.51, 2.13 and 2.93 at 1.4, 1.2 and 1.0; on a GRU over Markov-chain token sequences 4.44,
6.07 and 10.86 at 1.6, 1.3 and 1.0. It grows as the target loss tightens and differs between
models (the median is within 1.5x of 9 of the 12): a probe reports the calibrated ``B_crit``
saying so."""


@dataclass(frozen=True)
class ProbeResult:
    """What a short training run measured: ``b_simple`` (the ratio of the mean ``tr Σ`` to the
    mean ``|G|²`` over the second half of the measurements) with a ``band`` (the 10th and 90th
    percentiles of that ratio over bootstrap resamples of the same measurements; resamples
    whose mean ``|G|²`` is not positive count as unbounded), against the config's
    ``global_batch``; ``suggested_batch`` (the power of two nearest the task's calibrated
    ``B_crit`` where it has one, else nearest ``b_simple``, that the workers divide) and the
    learning rate the config's scaling rule gives there."""

    run_id: str
    b_simple: float
    band: tuple[float, float]
    global_batch: int
    suggested_batch: int
    suggested_learning_rate: float
    learning_rate: float
    lr_rule: str
    calibration: Calibration | None = None
    """This task's measured ``B_crit`` (:mod:`toolkit.launching.calibrate`), if one was kept."""

    @property
    def b_noise(self) -> float:
        """The one ``B_noise`` every statement of :meth:`reading` uses: this task's calibrated
        ``B_crit`` where it has one (measured steps to a loss), else ``B_simple`` (a floor:
        McCandlish et al.'s own stand-in, which grows as the loss falls)."""
        return self.calibration.headline["b_crit"] if self.calibration else self.b_simple

    def reading(self) -> str:
        """The result in plain language with one model of the steps (McCandlish et al.: steps
        to a given loss go as ``S_min·(1 + B_noise/B)``, so doubling ``B`` divides the steps
        by ``(1 + n)/(1 + n/2)`` with ``n = B_noise/B``), ``B_noise`` being :attr:`b_noise`
        and said to be; without a calibration, the ``B_crit`` that :data:`CALIBRATION` gives
        as what ``calibrate`` would likely find."""
        b, low, high = self.b_simple, *self.band
        noise = self.b_noise
        model = (
            f"taking B_noise as this task's calibrated B_crit ({noise:,.0f})"
            if self.calibration
            else f"taking B_noise as B_simple ({noise:,.0f}), a floor"
        )
        ratio = self.global_batch / noise
        where = f"{1 / ratio:.1f}× below" if ratio < 1 else f"{ratio:.1f}× above"
        doubling = (1 + 1 / ratio) / (1 + 1 / (2 * ratio))
        lines = [
            f"B_simple ≈ {b:,.0f} at the start of training (10–90% band {low:,.0f}–{high:,.0f}: "
            "the probe's last half, at your batch and peak rate held constant, bootstrapped). "
            f"{noise_scale.GROWS}.",
            self.calibration.reading()
            if self.calibration
            else f"B_crit ≈ {CALIBRATION[0] * b:,.0f} ({CALIBRATION[1] * b:,.0f}–"
            f"{CALIBRATION[2] * b:,.0f}): B_simple × {CALIBRATION[0]:g}, the median factor "
            "measured with this probe on four tasks of three model families (MNIST-1D's CNN "
            "and MLP, a GRU on token sequences) at three losses each (docs/notes/study.md); "
            f"it varied {CALIBRATION[1]:g}–{CALIBRATION[2]:g} there, growing as the loss "
            "tightens and between models, so this is a guess within a factor of 3 "
            "either way: `python -m toolkit calibrate CONFIG` measures it on yours.",
            f"Steps to a given loss, {model}: your global batch {self.global_batch:,} is "
            f"{where} it, and doubling it would divide the steps by about {doubling:.2f}. Up "
            f"to about {noise / 4:,.0f} each doubling nearly halves the steps (≥ 1.8×); around "
            f"{noise:,.0f} it saves about a quarter; beyond {4 * noise:,.0f} under 10%: extra "
            "batch there buys little.",
        ]
        if self.lr_rule == "adascale":
            lines.append(
                "lr_scaling is adascale: at any batch the rate follows AdaScale's gain, "
                f"measured as the run trains (from {self.learning_rate:.4g} up to "
                "global batch / base batch times it)."
            )
        elif self.lr_rule == "none":
            lines.append(
                f"At a batch of {self.suggested_batch:,} the learning rate stays "
                f"{self.learning_rate:.4g} (lr_scaling.rule is none; linear or sqrt scale it)."
            )
        else:
            lines.append(
                f"At a batch of {self.suggested_batch:,}, lr_scaling ({self.lr_rule}) gives a "
                f"learning rate of {self.suggested_learning_rate:.4g} "
                f"(now {self.learning_rate:.4g} at {self.global_batch:,})."
            )
        lines.append(self.advice())
        return "\n".join(lines)

    def advice(self) -> str:
        """The batch to use (:attr:`suggested_batch`) and why: near the calibrated ``B_crit``
        where this task has one (past it each doubling saves under a quarter of the steps),
        else near ``B_simple`` (a floor: B_simple grows as the loss falls)."""
        if self.calibration:
            b_crit = self.calibration.headline["b_crit"]
            return (
                f"Batch to use: {self.suggested_batch:,}, near this task's calibrated B_crit "
                f"({b_crit:,.0f}): "
                "below it each doubling of the batch still saves over a quarter of the steps to "
                "the loss, past it less and less."
            )
        return (
            f"Batch to use: {self.suggested_batch:,}, the power of two nearest this B_simple "
            "that your workers divide: up to it each doubling nearly halves the steps, and as "
            "B_simple grows during training a batch up to a few times larger pays too "
            "(`calibrate` measures where it stops paying)."
        )


def summarize(
    gns, run_id: str, config, world_size: int, calibration: Calibration | None = None
) -> ProbeResult:
    """A :class:`ProbeResult` from a run's ``gns`` events (a DataFrame) and its config (and the
    task's ``calibration``, if any)."""
    late = gns.iloc[len(gns) // 2 :]
    if len(late) < 5:
        raise ValueError(f"{run_id}: {len(gns)} noise-scale measurements; a probe needs >= 10")
    trace, grad_sq = late["trace_sigma_step"].to_numpy(), late["grad_sq_step"].to_numpy()
    if grad_sq.mean() <= 0:
        raise ValueError(f"{run_id}: the mean |G|² is not positive: probe for more steps")
    b_simple = float(trace.mean() / grad_sq.mean())
    rows = np.random.default_rng(0).integers(0, len(late), size=(1000, len(late)))
    means = grad_sq[rows].mean(axis=1)
    ratios = np.where(means > 0, trace[rows].mean(axis=1) / np.where(means > 0, means, 1), np.inf)
    # the empirical quantile, not an interpolation, which would subtract inf from inf
    low, high = np.percentile(ratios, [10, 90], method="inverted_cdf")
    scale = Scale.of(config, world_size)
    aim = calibration.headline["b_crit"] if calibration else b_simple
    suggested = _suggested_batch(aim, world_size)
    at_suggested = config.model_copy(
        update={"batch": config.batch.model_copy(update={"global_size": suggested})}
    )
    return ProbeResult(
        run_id=run_id,
        b_simple=b_simple,
        band=(float(max(low, 0.0)), float(high)),
        global_batch=scale.global_batch,
        suggested_batch=suggested,
        suggested_learning_rate=Scale.of(at_suggested, world_size).learning_rate,
        learning_rate=scale.learning_rate,
        lr_rule=config.lr_scaling.rule,
        calibration=calibration,
    )


def _suggested_batch(b_simple: float, workers: int) -> int:
    """The power of two nearest ``b_simple`` (at least one example per worker) that
    ``workers`` divide, else the nearest multiple of ``workers``."""
    power = 2 ** max(0, round(math.log2(max(b_simple, 1))))
    return power if power % workers == 0 else max(workers, round(power / workers) * workers)


def stated_path(schedule, batches: int, batches_per_epoch: int) -> dict:
    """The probe's schedule, the same path whatever the config's: its warmup (in batches, at
    most the probe's first half), then its peak rate held constant (no decay), so that the
    measured second half is always at the config's scaled rate and batch, from its start.
    ``batches`` is the probe's length and ``batches_per_epoch`` the config's epoch, in
    batches; the result is a ``schedule`` mapping in the probe's epochs (each
    ``min(batches, batches_per_epoch)`` long). AdaScale's probe keeps its base rate, an
    adaptive batch its first batch (:func:`probe`)."""
    warmup = schedule.warmup.model_dump(mode="json")
    warmup_batches = min(warmup["epochs"] * batches_per_epoch, batches / 2)
    warmup["epochs"] = warmup_batches / min(batches, batches_per_epoch)
    return {"name": "constant", "warmup": warmup}


MAX_PROBE_STEPS = 1_000_000  # a probe is a short run: more is a typo


def probe(
    config, *, steps: int = 200, np: int = 1, runs_root=None, in_process: bool | None = None
) -> ProbeResult:
    """Train ``config`` for about ``steps`` updates from its start on the probe's stated path
    (:func:`stated_path`), measuring the noise scale at every update, and return what it
    says.
    With ``np == 1`` the probe trains in this process (unless ``in_process=False``);
    otherwise under horovodrun, as a launched run. Its run directory is marked ``probe: true`` in
    ``meta.json`` (the Runs page hides probes unless asked)."""
    from toolkit import config as config_lib
    from toolkit.runs.events import read_events

    for name, value, high in (
        ("steps", steps, MAX_PROBE_STEPS),
        ("np", np, config_lib.MAX_WORKERS),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
            span = f"from 1 to {high:,}"
            raise config_lib.ConfigError(f"probe: {name} must be an integer {span} (got {value!r})")
    plan = RunPlan.of(config, config.dataset.train_examples(), np)
    batches, per_epoch = steps * plan.steps_per_update, plan.steps_per_epoch
    short = config_lib.from_mapping(
        {
            **config.model_dump(mode="json"),
            "name": f"probe-{config.name}"[:64],
            "workers": np,
            "schedule": stated_path(config.schedule, batches, per_epoch),
        },
        [
            f"epochs={math.ceil(batches / per_epoch)}",
            f"steps_per_epoch={min(batches, per_epoch)}",
            "logging.noise_scale_every_steps=1",
            *(["lr_scaling.rule=none"] if config.lr_scaling.rule == "adascale" else []),
            *(  # an adaptive batch's first, fixed
                ["batch.adaptive=null", f"batch.accumulation={plan.steps_per_update}"]
                if config.batch.adaptive
                else []
            ),
        ],
    )
    if in_process if in_process is not None else np == 1:
        from toolkit.train import train

        run = train(short, runs_root=runs_root, verbose=0, meta={"probe": True})
    else:
        from toolkit.launching import launch
        from toolkit.runs import monitor

        run = launch.launch(short, runs_root_dir=runs_root, meta={"probe": True})
        state = monitor.follow(run, progress=False)["state"]
        if state != State.COMPLETED:
            raise RuntimeError(f"probe run {run.run_id} {state}: see {run.stdout_path}")
    events = read_events(run.events_path)
    gns = events[events["phase"] == "gns"] if "phase" in events else events
    calibration = critical_batch.stored(config, runs_root_of(runs_root))
    return summarize(gns, run.run_id, config, np, calibration)
