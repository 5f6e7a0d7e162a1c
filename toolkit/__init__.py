"""Large-Batch Lab: large-batch distributed training for Keras 3 with Horovod.

Modules: ``optimizers`` (SGD, LARS, LBSGD), ``schedules``, ``config`` (the experiment schema),
``data``, ``models``, ``distributed`` (Horovod glue), ``train``, ``launch``, ``monitor``,
``rundir``, ``events``, ``checkpoints``, ``callbacks``, ``experiment``. Importing the package
imports none of them, so ``toolkit.events`` or ``toolkit.rundir`` stay cheap for readers such
as the app.
"""

import os as _os

__version__ = "0.1.0"

# TensorFlow's C++ start-up lines (oneDNN, CPU features) are INFO: keep its warnings and errors
# only, unless the user asked for more. Set before any toolkit module imports TensorFlow.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
