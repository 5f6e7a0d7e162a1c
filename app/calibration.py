"""The Launch page's calibration panel: the critical batch kept for the config's task, if any,
and the grid that would measure it (:mod:`toolkit.launching.calibrate`) with its cost, started
in the background on request; its cells follow on the Sweep page like any sweep's."""

from __future__ import annotations

import streamlit as st

from app import data
from app.actions import act
from app.data import md_escape
from toolkit.config import ConfigError, ExperimentConfig
from toolkit.launching import calibrate, sweep_runner
from toolkit.scaling import critical_batch

RATE_CHOICES = (0.25, 0.5, 1.0, 2.0, 4.0)


def panel(config: ExperimentConfig) -> None:
    """What is known of the config's critical batch, and the form that measures it."""
    root = data.root()
    if kept := critical_batch.stored(config, root):
        st.info(md_escape(kept.reading()))
        with st.expander("The calibration, target by target"):
            st.code(kept.table(), language=None)
    if st.toggle("Calibrate the critical batch on this config (a sweep of short runs)"):
        st.caption(
            "McCandlish et al.'s method: steps to a held-out loss at each batch, at its best "
            "rate, fitted with S = S_min (1 + B_crit / B). The runs are ordinary sweep cells: "
            "they resume, and the Sweep page follows them."
        )
        largest = calibrate.largest_batch(config)
        options = [2**k for k in range(0, largest.bit_length()) if config.workers <= 2**k]
        defaults = calibrate.default_batches(config)
        left, middle, right = st.columns(3)
        batches = left.multiselect("Batches", sorted({*options, *defaults}), default=defaults)
        factors = middle.multiselect(
            "Rates (x each batch's scaled rate)",
            RATE_CHOICES,
            default=calibrate.RATE_FACTORS,
        )
        epochs = right.number_input(
            "Passes over the data at your batch",
            min_value=1,
            value=min(config.epochs, calibrate.EPOCHS),
            help="a larger batch B makes sqrt(B / yours) times as many; each run's held-out "
            f"loss is read {calibrate.EVALUATIONS} times whatever its passes (its rounds)",
        )
        try:
            grid = calibrate.grid(
                config, batches=sorted(batches), rate_factors=factors, epochs=int(epochs)
            )
            cells = data.sweep_plan(grid.to_yaml())
        except ConfigError as error:  # e.g. more workers than this machine's slots
            st.warning(md_escape(f"The calibration cannot run: {error}"))
            return
        startup = sweep_runner.startup(root)
        rates = sweep_runner.throughputs(root, summarize=data.summary)
        estimated = sweep_runner.estimate(grid, cells, rates, startup)
        parallel = sweep_runner.default_parallel(grid, root)
        shown = cells.assign(estimated_s=estimated.seconds.round(), priced=estimated.basis)
        st.dataframe(calibrate.shown(shown, config), hide_index=True, placeholder="")
        st.caption(md_escape(sweep_runner.cost(estimated, cells, parallel, startup)))
        running = sweep_runner.runner_active(grid.name, root)
        if running:
            st.caption(f"Calibration {grid.name} is running: the Sweep page follows its runs.")
        if st.button("Start the calibration", disabled=running):
            pid = act(
                lambda: calibrate.start(
                    config, root, batches=sorted(batches), rate_factors=factors, epochs=int(epochs)
                )
            )
            st.success(
                md_escape(
                    f"Calibration {grid.name} started (pid {pid}, {len(cells)} runs); the "
                    "probe answers with its B_crit once it ends."
                )
            )
