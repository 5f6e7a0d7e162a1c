"""A run on disk and everything that reads it: the run directory, its lock and state
(``rundir``, its states one type in ``states``), where it runs in words and a scheduler's live
state (``placement``, ``slurm_jobs``), its events (``events``), recorded processes
(``processes``), checkpoints (``checkpoints``), the runs table (``table``), following it live
(``monitor``), the panels its events draw as (``curves``, ``theme``) and its exports to
TensorBoard (``tensorboard_export``) and MLflow (``mlflow_export``, ``mlflow_live``)."""
