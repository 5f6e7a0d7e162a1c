"""Starting runs, on this host or many: the front door (``launch``), where a run runs
(``executors``: this machine under a ``supervisor`` and the queue, ``slots``; hosts over ssh;
Slurm, ``slurm`` and ``slurm_job``; any registered beside them), why a launched run failed
(``failures``), sets of runs (one ``runner`` with its ``runner_lock``, and its policies: a sweep,
``sweep``, ``sweep_runner``, ``sweep_results``; a search, ``search``, ``search_runner``; a
calibration), the noise-scale probe (``probe``) and the critical batch (``calibrate``), the
hosts (``hosts``, ``remote`` over ssh, ``preflight`` before a multi-host launch, ``cluster`` and
``cluster_slurm``: the namespace cluster) and JupyterLab (``jupyter``)."""
