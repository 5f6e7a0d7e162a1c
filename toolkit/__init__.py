"""Large-Batch Lab: large-batch distributed training for Keras 3 with Horovod.

Modules: ``optimizers`` (SGD, LARS, LBSGD), ``schedules``, ``config`` (the experiment schema),
``data``, ``models``, ``distributed`` (Horovod glue), ``train``, ``launch``, ``monitor``,
``rundir``, ``events``, ``checkpoints``, ``callbacks``, ``experiment``. Importing the package
imports none of them, so ``toolkit.events`` or ``toolkit.rundir`` stay cheap for readers such
as the app.
"""

__version__ = "0.1.0"
