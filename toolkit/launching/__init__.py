"""Starting runs, on this host or many: the front door (``launch``), where a run runs
(``executors``: this machine under a ``supervisor`` and the queue, ``slots``; hosts over ssh;
Slurm, ``slurm`` and ``slurm_job``), why a launched run failed (``failures``), sets of runs
(``sweep``, ``sweep_runner``, ``sweep_results``; ``search``, ``search_runner``; one runner each,
``runner_lock``), the noise-scale probe (``probe``) and the critical batch (``calibrate``), the
hosts (``hosts``, ``remote`` over ssh, ``preflight`` before a multi-host launch, ``cluster`` and
``cluster_slurm``: the namespace cluster) and JupyterLab (``jupyter``)."""
