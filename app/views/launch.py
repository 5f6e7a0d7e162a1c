"""Launch: a form of the config's fields (prefilled from a preset), laid out by hand in
sections; each widget reads its choices, bounds, default and help from the schema and the
registries (:mod:`app.form`), so a new value of an existing field needs no change here, but a
new field does. Below it, the run's schedule and batch/learning-rate scaling before it starts,
and validation messages next to the fields. Runs start only through
``toolkit.launching.launch.launch``, which hands them to the executor the config chooses."""

import streamlit as st
import yaml

from app import calibration, charts, data, form
from app.actions import act
from app.data import md_escape
from app.fields import PresetFields
from toolkit import advice, backends, config_rules, safe_yaml
from toolkit import config as config_lib
from toolkit.catalog import SCHEDULES
from toolkit.config import ConfigError, field_errors
from toolkit.launching import launch as launcher
from toolkit.launching import probe as probe_lib
from toolkit.launching.executors import registry
from toolkit.optimizers import OPTIMIZERS
from toolkit.plan import Scale
from toolkit.runs import placement
from toolkit.training.data import DATASETS
from toolkit.training.models import MODELS

st.title("Launch a run")
preset = st.selectbox(
    "Start from",
    form.presets(),
    index=form.presets().index(form.FIRST),
    help="experiments/*.yaml, or the schema's defaults",
)
given = form.preset_mapping(preset)
slots, local = form.Slots(), {}


fields = PresetFields(preset, given, slots, local)
key, default, select, component = fields.key, fields.default, fields.select, fields.component
number, optional_float, text = fields.number, fields.optional_float, fields.text
checkbox, tristate = fields.checkbox, fields.tristate


slots.add("config")
raw = {}
top = st.columns([2, 1, 1, 1, 2])
with top[0]:
    raw["name"] = text("Run name", "name")
with top[1]:
    raw["seed"] = number("Seed", "seed")
with top[2]:
    raw["workers"] = number("Workers", "workers")
with top[3]:
    backend = st.selectbox(
        "Keras backend",
        backends.BACKENDS,
        index=backends.BACKENDS.index(backends.chosen(None)),
        key=key("keras_backend"),
        help="what the workers run (their KERAS_BACKEND; default: this app's); several "
        "workers talk through Horovod on tensorflow and torch, through JAX's own engine on jax",
    )
    slots.add("keras_backend")
with top[4]:
    asked = [e for e in registry.EXECUTORS if e.section and form.get(given, e.section) is not None]
    chosen = asked[0] if asked else form.LOCAL
    chosen = form.HOSTS if chosen is form.LOCAL and form.get(given, "hosts") else chosen
    places = form.where_choices()
    where = st.radio(
        "Where", places, index=places.index(chosen.title), horizontal=True, key=key("where")
    )
raw["hosts"], raw["slurm"] = None, None
if where == form.HOSTS.title:
    raw["hosts"] = (
        text("Hosts", "hosts", help="name:slots,... (empty: localhost:workers)").strip() or None
    )
elif where == form.SLURM.title:
    st.caption(
        "Submitted to Slurm as a job of one task per worker (sbatch; every rank under srun). "
        "Slurm's queue is the run's: it reads queued, with Slurm's reason, until it starts."
    )
if place := form.asked_place(where, preset, given):
    section, fields = place
    raw[section] = fields
    slots.add(section)
with st.expander("Workers' network: ssh port and key, interface, a silent worker's timeout"):
    cells = st.columns(4)
    with cells[0]:
        raw["ssh_port"] = number("SSH port", "ssh_port", help="empty: ssh's default (22)")
    with cells[1]:
        raw["ssh_identity_file"] = (
            text("SSH identity file", "ssh_identity_file", help="empty: ssh's own").strip() or None
        )
    with cells[2]:
        raw["network_interface"] = (
            text("Network interface", "network_interface", help="empty: all hosts' common").strip()
            or None
        )
    with cells[3]:
        raw["lost_worker_after_s"] = number(
            "A silent worker is lost after (s)",
            "lost_worker_after_s",
            help="Gloo's timeout: a stopped or cut-off worker fails the run after this",
        )
with st.expander("Elastic: train on while workers leave and join (hosts from discovery)"):
    elastic_on = st.checkbox(
        "Elastic",
        value=form.get(given, "elastic") is not None,
        key=key("elastic.on"),
        help="horovodrun --min-np/--max-np --host-discovery-script; needs a fixed global batch",
    )
    cells = st.columns(3)
    elastic = {}
    with cells[0]:
        elastic["min_workers"] = number("Fewest workers", "elastic.min_workers", "ElasticConfig")
        elastic["commit_every_steps"] = number(
            "Commit every (steps)", "elastic.commit_every_steps", "ElasticConfig"
        )
    with cells[1]:
        elastic["max_workers"] = number("Most workers", "elastic.max_workers", "ElasticConfig")
        elastic["timeout_s"] = number("Wait for fewest (s)", "elastic.timeout_s", "ElasticConfig")
    with cells[2]:
        elastic["discovery"] = text(
            "Hosts file or discovery script",
            "elastic.discovery",
            "ElasticConfig",
            help="host:slots lines; an executable file is run and its output read",
        ).strip()
        elastic["cooldown_s"] = number(
            "A failed host may rejoin after (s)", "elastic.cooldown_s", "ElasticConfig"
        )
    slots.add("elastic")
    raw["elastic"] = elastic if elastic_on else None

left, right = st.columns(2)
with left, st.container(border=True):
    raw["dataset"] = component("Dataset", DATASETS, "dataset", "DatasetConfig", skip=("seed",))
with right, st.container(border=True):
    raw["model"] = component(
        "Model",
        MODELS,
        "model",
        "ModelConfig",
        skip=("input_shape", "num_classes", "seed"),
    )

left, right = st.columns(2)
with left, st.container(border=True):
    st.subheader("Optimizer")
    learning_rate = number("Base learning rate", "optimizer.learning_rate", "OptimizerConfig")
    raw["optimizer"] = component(
        "Optimizer",
        OPTIMIZERS,
        "optimizer",
        "OptimizerConfig",
        skip=("learning_rate", "name"),
        more=form.KERAS_BASE,
    )
    raw["optimizer"]["learning_rate"] = learning_rate
with right, st.container(border=True):
    st.subheader("Schedule")
    schedule = {"name": select("Schedule", list(SCHEDULES), "schedule.name", "ScheduleConfig")}
    shown = yaml.safe_dump(
        form.get(given, "schedule.params", {}) or {}, default_flow_style=True
    ).strip()
    typed = st.text_input(
        "Schedule params (YAML mapping)",
        value=shown,
        key=key("schedule.params"),
        help=form.schedule_help(schedule["name"]),
    )
    try:
        schedule["params"] = safe_yaml.load(typed, "schedule params") or {}
    except safe_yaml.YamlError as error:
        local["schedule.params"] = str(error)
    slots.add("schedule.params")
    slots.add("schedule")
    cells = st.columns(3)
    with cells[0]:
        epochs = number("Warmup epochs", "schedule.warmup.epochs", "WarmupConfig")
    with cells[1]:
        strategy = select(
            "Warmup strategy",
            form.choices("WarmupConfig", "strategy"),
            "schedule.warmup.strategy",
            "WarmupConfig",
        )
    with cells[2]:
        initial = number("Initial multiplier", "schedule.warmup.initial_multiplier", "WarmupConfig")
    schedule["warmup"] = {
        "epochs": epochs,
        "strategy": strategy,
        "initial_multiplier": initial,
    }
    raw["schedule"] = schedule

with st.container(border=True):
    st.subheader("Batch, scaling and length")
    cells = st.columns(5)
    with cells[0]:
        per_worker = number("Batch per worker", "batch.per_worker", "BatchConfig")
    with cells[1]:
        accumulation = number("Accumulation steps", "batch.accumulation", "BatchConfig")
    with cells[2]:
        rule = select(
            "Learning-rate scaling rule",
            form.choices("ScalingConfig", "rule"),
            "lr_scaling.rule",
            "ScalingConfig",
        )
    with cells[3]:
        base_batch = number("Base batch", "lr_scaling.base_batch", "ScalingConfig")
    with cells[4]:
        global_size = number(
            "Global batch (optional)",
            "batch.global_size",
            "BatchConfig",
            help="fixes the global batch on any number of workers; per worker is then derived",
        )
    raw["batch"] = {
        "per_worker": per_worker,
        "accumulation": accumulation,
        "global_size": global_size,
    }
    raw["lr_scaling"] = {"rule": rule, "base_batch": base_batch}
    if rule == "adascale":
        st.caption(
            "AdaScale: the learning rate and schedule are the base batch's; each update "
            "multiplies the rate by a gain between 1 and global batch / base batch, measured "
            "from the gradient noise, and the run ends when AdaScale's clock has done the base "
            "run's epochs (its own epochs are an outcome)."
        )
        adaptive_on = st.checkbox(
            "Adaptive batch",
            value=form.get(given, "batch.adaptive") is not None,
            key=key("batch.adaptive.on"),
            help="the global batch follows the measured noise scale B_simple (powers of two), "
            "by local accumulation of per-worker batches",
        )
        cells = st.columns(5)
        adaptive = {}
        with cells[0]:
            adaptive["min"] = number(
                "Smallest global batch", "batch.adaptive.min", "AdaptiveBatchConfig"
            )
        with cells[1]:
            adaptive["max"] = number(
                "Largest global batch", "batch.adaptive.max", "AdaptiveBatchConfig"
            )
        with cells[2]:
            adaptive["every_epochs"] = number(
                "Decide every (epochs)", "batch.adaptive.every_epochs", "AdaptiveBatchConfig"
            )
        with cells[3]:
            adaptive["aim"] = number(
                "Aim (× the noise scale)",
                "batch.adaptive.aim",
                "AdaptiveBatchConfig",
                help="1 follows the noise scale; your task's B_crit / B_simple (calibrate "
                "prints it) aims at the critical batch",
            )
        with cells[4]:
            adaptive["hysteresis"] = number(
                "Hysteresis",
                "batch.adaptive.hysteresis",
                "AdaptiveBatchConfig",
                help="0: the power of two nearest the aim; up to 1: the aim must go that far "
                "past the midpoint to the next power before the batch moves",
            )
        slots.add("batch.adaptive")
        if adaptive_on:
            raw["batch"]["adaptive"] = adaptive
    cells = st.columns(3)
    with cells[0]:
        raw["epochs"] = number("Epochs", "epochs")
    with cells[1]:
        raw["steps_per_epoch"] = number(
            "Steps per epoch cap", "steps_per_epoch", help="empty: the whole shard"
        )
    with cells[2]:
        raw["precision"] = select("Precision", form.choices(None, "precision"), "precision")

with st.expander("Synchronisation: what the workers average, and what goes on the wire"):
    cells = st.columns(6)
    with cells[0]:
        sync = select(
            "Synchronisation", form.choices("SyncConfig", "mode"), "sync.mode", "SyncConfig"
        )
    with cells[1]:
        period = number("Period, partial or local SGD (updates)", "sync.period", "SyncConfig")
    raw["sync"] = {"mode": sync, "period": period}
    section = "AllreduceConfig"
    cells = st.columns(6)
    with cells[0]:
        compression = select(
            "Compression",
            form.choices(section, "compression"),
            "allreduce.compression",
            section,
        )
    with cells[1]:
        ratio = number("Top-k: ratio sent", "allreduce.ratio", section)
        topk_sample = number(
            "Top-k: sample (0: exact)",
            "allreduce.topk_sample",
            section,
            help="estimate the k-th magnitude from this fraction of the entries (DGC)",
        )
    with cells[2]:
        threshold = number(
            "Threshold: |g| ≥ (2bit: ±)",
            "allreduce.threshold",
            section,
            help="threshold: the smallest |g| sent; 2bit: the value each entry sends, or 0",
        )
    with cells[3]:
        residual = checkbox(
            "Residual",
            "allreduce.residual",
            section,
            help="topk/threshold/2bit: error feedback, what was not sent joins the next step",
        )
    with cells[4]:
        fp16_clip = optional_float(
            "FP16: clip before the cast",
            "allreduce.fp16_clip",
            section,
            help="empty: 65504 / workers, so the sum over the workers stays finite",
        )
    with cells[5]:
        fusion = number("Fusion threshold (MB)", "allreduce.fusion_threshold_mb", section)
    cells = st.columns(6)
    with cells[0]:
        value_dtype = select(
            "Sparse values on the wire",
            form.choices(section, "value_dtype"),
            "allreduce.value_dtype",
            section,
        )
    with cells[1]:
        dgc = checkbox(
            "DGC preset",
            "allreduce.dgc",
            section,
            help="Deep Gradient Compression (topk, threshold, 2bit): momentum correction and "
            "masking, local clipping, a sparsity warm-up (topk) and dense 1-D variables, each "
            "unless set otherwise here",
        )
        dense_norm = checkbox(
            "LARS: dense norm",
            "allreduce.dense_norm",
            section,
            help="trust ratios from the dense gradients' norm, not the sparse update's",
        )
    switches = {}
    for cell, (name, label) in zip(
        cells[2:5],
        [
            ("momentum_correction", "Momentum correction"),
            ("momentum_masking", "Momentum masking"),
            ("dense_1d", "Dense 1-D variables"),
        ],
        strict=True,
    ):
        with cell:
            switches[name] = tristate(label, f"allreduce.{name}", section)
    with cells[5]:
        follows_dgc = "empty: the DGC preset's with it, else off; 0: off"
        switches["local_clipnorm"] = optional_float(
            "Local clip norm", "allreduce.local_clipnorm", section, help=follows_dgc
        )
        switches["sparsity_warmup_epochs"] = number(
            "Sparsity warm-up (epochs)",
            "allreduce.sparsity_warmup_epochs",
            section,
            help=follows_dgc,
        )
    raw["allreduce"] = {
        "compression": compression,
        "ratio": ratio,
        "topk_sample": topk_sample,
        "threshold": threshold,
        "residual": residual,
        "value_dtype": value_dtype,
        "fp16_clip": fp16_clip,
        "dgc": dgc,
        **switches,
        "dense_norm": dense_norm,
        "fusion_threshold_mb": fusion,
    }
    link_gbit = st.number_input(
        "When does it pay? Link between the hosts (Gbit/s)",
        min_value=0.01,
        value=1.0,
        format="%g",
        key="link_gbit",
        help="the model below predicts each mode's time per update on this link",
    )
    pays = st.empty()  # filled once the config is valid

with st.expander("Logging and checkpoints"):
    cells = st.columns(5)
    with cells[0]:
        every = number("Train event every (steps)", "logging.every_steps", "LoggingConfig")
    with cells[1]:
        ratio_every = number(
            "Trust ratios every (steps)",
            "logging.trust_ratio_every_steps",
            "LoggingConfig",
        )
    with cells[2]:
        start = default("logging.noise_scale_every_steps", "LoggingConfig")
        noise_every = st.number_input(
            "Noise scale every (updates, 0: off)",
            value=None if start == "auto" else int(start),
            step=1,
            placeholder="auto",
            key=key("logging.noise_scale_every_steps"),
            help="empty: auto, every 25 updates with several workers (free in the allreduce), "
            "every 100 with one (an extra gradient each)",
        )
        slots.add("logging.noise_scale_every_steps")
    with cells[3]:
        noise_smoothing = number(
            "Noise scale smoothing", "logging.noise_scale_smoothing", "LoggingConfig"
        )
    with cells[4]:
        raw["checkpoint"] = {
            "every_epochs": number(
                "Checkpoint every (epochs)",
                "checkpoint.every_epochs",
                "CheckpointConfig",
            )
        }
    mirror, uri_cell, experiment_cell = st.columns([1, 2, 2])
    live_mlflow = mirror.checkbox(
        "Log to MLflow as it trains",
        value=form.get(given, "logging.mlflow", None) is not None,
        key=key("logging.mlflow"),
        help="logging.mlflow: rank 0 mirrors the run's events to MLflow; a server that is "
        "down does not stop training (python -m toolkit export mlflow catches it up)",
    )
    with uri_cell:
        uri = text(
            "MLflow tracking URI",
            "logging.mlflow.tracking_uri",
            "MlflowConfig",
            placeholder="default: .mlflow/mlflow.db under the runs root",
            disabled=not live_mlflow,
        ).strip()
    with experiment_cell:
        experiment = text(
            "MLflow experiment",
            "logging.mlflow.experiment",
            "MlflowConfig",
            placeholder="default: the config's name",
            disabled=not live_mlflow,
        ).strip()
    raw["logging"] = {
        "every_steps": every,
        "trust_ratio_every_steps": ratio_every,
        "noise_scale_every_steps": "auto" if noise_every is None else noise_every,
        "noise_scale_smoothing": noise_smoothing,
        "mlflow": {"tracking_uri": uri or None, "experiment": experiment or None}
        if live_mlflow
        else None,
    }

config, errors = None, dict(local)
try:
    config = config_lib.from_mapping(raw)
    config_rules.check_backend(config, backend)
except ConfigError as error:
    errors.update(field_errors(error) if config is None else {"keras_backend": str(error)})

st.subheader("Before it starts")
preview = None
if config is not None and not errors:
    try:
        with st.spinner("Computing the schedule…"):
            preview, plan = form.preview(config.to_yaml())
    except ConfigError as error:  # the batch does not fit the dataset's shards
        errors["batch.per_worker"] = str(error)
    except Exception as error:  # noqa: BLE001 -- e.g. a dataset that needs internet
        st.warning(md_escape(f"No schedule preview: {error}"))
slots.show(errors)
if errors:
    st.error("Fix the fields marked above: nothing can be launched until the config is valid.")
elif config is not None:
    figures, scale = st.columns(4), Scale.of(config)
    figures[0].metric("Global batch", f"{scale.global_batch:,}")
    figures[1].metric("Scaled learning rate", f"{scale.learning_rate:.4g}")
    peak = float(preview["lr"].max()) if preview is not None and len(preview) else None
    for finding in advice.warnings(config, peak):
        st.warning(md_escape(finding))
    try:
        pays.markdown(form.when_it_pays(config, link_gbit))
    except Exception as error:  # noqa: BLE001 -- e.g. a dataset that needs internet
        pays.caption(md_escape(f"No cost prediction: {error}"))
    if preview is not None:
        figures[2].metric("Steps per epoch", f"{plan.steps_per_epoch:,}")
        figures[3].metric("Total steps", f"{plan.total_steps:,}")
        st.plotly_chart(charts.schedule(preview), theme=None)
    with st.expander("Resolved config (YAML)"):
        st.code(config.to_yaml(), language="yaml")

if config is not None and not errors:
    st.markdown("**What batch should I use?** A short run measures the gradient noise scale.")
    if st.button("Probe", help="about 200 updates of this config with its workers"):
        result = act(
            lambda: probe_lib.probe(
                config, np=config.workers, runs_root=data.root(), in_process=False
            ),
            doing="Probing: a short training run…",
            failed="The probe failed: ",
        )
        st.session_state.probe = (config.to_yaml(), result)
    if (kept := st.session_state.get("probe")) and kept[0] == config.to_yaml():
        result = kept[1]
        cells = st.columns(3)
        cells[0].metric("Noise scale B_simple", f"{result.b_simple:,.0f}")
        cells[1].metric("Global batch", f"{result.global_batch:,}")
        cells[2].metric("Suggested batch", f"{result.suggested_batch:,}")
        st.text(result.reading())
    calibration.panel(config)

run_id = st.text_input(
    "Run id",
    placeholder="<run name>-b<batch>-<optimizer>-<hex>",
    help="the run's directory, as the CLI's --name gives it; empty: a new id from the run name",
).strip()
if st.button("Launch", type="primary"):
    if errors or config is None:
        st.error("Nothing was launched: the config is not valid.")
    else:
        run = act(
            lambda: launcher.launch(
                config, runs_root_dir=data.root(), run_id=run_id or None, backend=backend
            ),
            failed="Nothing was launched: ",
        )
        st.session_state.current_run = run.run_id
        status = run.recorded_status()
        said = f"; {status['reason']}" if status.get("reason") else ""
        where = f"where: {placement.where(status)}{said}"
        st.success(md_escape(f"Launched {run.run_id} in {run.path}, {where}"))
        st.page_link("views/detail.py", label="Follow it live", icon=":material/monitoring:")
