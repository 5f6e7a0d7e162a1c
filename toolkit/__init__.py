"""Large-Batch Lab: large-batch distributed training for Keras 3 with Horovod.

At the top: ``config`` (the experiment schema), ``catalog``, ``registry``, ``safe_yaml``,
``files`` and ``train`` (one worker: ``python -m toolkit.train``). The packages: ``runs`` (the
run directory and its readers), ``optimizers`` (with ``schedules``), ``scaling`` (the noise
scale, AdaScale, the adaptive batch), ``parallel`` (Horovod for Keras 3), ``training`` (a
config's experiment and its callbacks) and ``launching`` (runs, the queue, sweeps, hosts).
docs/notes/architecture.md maps them. Importing the package, or any of them but ``optimizers``,
imports none of their modules, so ``toolkit.runs.events`` stays cheap for readers such as the
app.
"""

import os as _os

__version__ = "0.1.0"

# TensorFlow's C++ start-up lines (oneDNN, CPU features) are INFO: keep its warnings and errors
# only, unless the user asked for more. Set before any toolkit module imports TensorFlow.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
