"""What one worker trains from: a config's dataset, model and optimizer (``experiment``, over
``data`` and ``models``), and the callbacks that log, checkpoint and guard it (``callbacks``,
with ``system``'s CPU, memory and GPU samples). ``toolkit.train`` runs them."""
