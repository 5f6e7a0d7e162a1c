"""Starting runs, on this host or many: a run under a supervisor (``launch``), the queue
(``slots``), sweeps (``sweep``), the noise-scale probe (``probe``), the hosts (``hosts``,
``remote`` over ssh, ``preflight`` before a multi-host launch, ``cluster``: the namespace
cluster) and JupyterLab (``jupyter``)."""
