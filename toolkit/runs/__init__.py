"""A run on disk and everything that reads it: the run directory, its lock and state
(``rundir``), its events (``events``), recorded processes (``processes``), checkpoints
(``checkpoints``), following it live (``monitor``), the panels its events draw as (``curves``,
``theme``) and its export to TensorBoard (``tensorboard_export``)."""
