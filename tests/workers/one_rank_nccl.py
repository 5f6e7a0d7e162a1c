"""Run under ``horovodrun -np 1`` on a GPU machine (tests/test_gpu.py): pin the GPU, allreduce
a GPU tensor (through NCCL in the GPU build), and write what was seen to ``<out>/rank0.json``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import horovod.tensorflow as hvd
import tensorflow as tf

from toolkit.parallel import distributed

distributed.init()
with tf.device("/GPU:0"):
    x = tf.range(1024, dtype=tf.float32)
    total = hvd.allreduce(x, op=hvd.Sum, name="nccl_check")
seen = {
    "visible_gpus": len(tf.config.get_visible_devices("GPU")),
    "device": total.device,
    "equal": bool(tf.reduce_all(total == x).numpy()),
}
(Path(sys.argv[1]) / "rank0.json").write_text(json.dumps(seen))
