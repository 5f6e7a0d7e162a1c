"""Where a run runs, one object per place: this machine, hosts over ssh, Slurm
(:mod:`toolkit.launching.executors.registry` chooses one from a config)."""
