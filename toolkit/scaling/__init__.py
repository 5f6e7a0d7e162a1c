"""How the batch can grow: the gradient noise scale's estimator (``noise_scale``), AdaScale's
gain and clock (``adascale``) and the adaptive batch's rule and plan (``adaptive_batch``)."""
