"""The Large-Batch Lab dashboard (Streamlit). Entry point: ``streamlit run app/main.py``."""

import gc

import toolkit.optimizers  # noqa: F401 -- Keras and TensorFlow, once per server process

# Streamlit calls gc.collect() (and keras.backend.clear_session(), which collects again) after
# every rerun. TensorFlow's ~450k long-lived objects made each collection take ~0.3 s; freezing
# what exists after the imports keeps them out of the collector's scans.
gc.freeze()
