"""What a failed collective says: that another worker is gone, not what went wrong here.

Elastic training resets on it (:mod:`toolkit.parallel.elastic`), and the launcher's reading of
a failure lets a worker's sentence replace it (:mod:`toolkit.launching.failures`). Imports
nothing, so the launcher stays free of TensorFlow.
"""


def collective_failed(message: str) -> bool:
    """Whether an error's ``message`` is a Horovod collective's failure: it names Horovod (its
    ops, its shut-down) or Gloo, whose transport reports a peer gone (``gloo/transport/tcp/
    pair.cc: Read error ... Connection reset by peer``)."""
    return "Horovod" in message or "gloo" in message.lower()
