"""Data parallelism on Horovod: the glue for Keras 3 (``distributed``: ``init``,
``DistributedOptimizer``, the allreduce hook, the noise meter), compressed allreduce
(``compression``), the synchronisation modes (``sync``) and elastic training's state and loop
(``elastic``)."""
