"""Codecs (toolkit/codecs.py): every mode a config can give is one, and each says what a worker
sends as arrays of that shape would hold it (numpy's ``nbytes``, the oracle). Cost: < 1 s."""

from __future__ import annotations

import math
import typing

import numpy as np
import pytest

from toolkit import codecs
from toolkit.communication import Communication, Techniques
from toolkit.sections import AllreduceConfig, SyncConfig


def test_every_mode_a_config_can_give_is_a_codec():
    field = AllreduceConfig.model_fields["compression"]
    assert set(typing.get_args(field.annotation)) == set(codecs.CODECS)
    assert field.default == codecs.DENSE.name
    with pytest.raises(ValueError, match="compression must be one of"):
        codecs.of("zip")


def test_every_encoded_mode_and_no_other_has_a_tensor_codec():
    from toolkit.parallel import compression

    assert set(compression.ENCODERS) == set(codecs.ENCODED)
    section = AllreduceConfig(compression="2bit", threshold=0.25)
    techniques = Techniques.of(section)
    assert compression.encoder(section, techniques, None).threshold == 0.25


@pytest.mark.parametrize("entries", [1, 15, 16, 17, 1000, 1_000_003])
@pytest.mark.parametrize("ratio, value_dtype", [(0.01, np.float32), (0.001, np.float16)])
def test_a_payload_is_what_its_arrays_hold(entries, ratio, value_dtype):
    dense = np.zeros(entries, np.float32)
    assert codecs.DENSE.payload_bytes(entries) == dense.nbytes
    assert codecs.FP16.payload_bytes(entries) == dense.astype(np.float16).nbytes
    words = np.zeros(math.ceil(2 * entries / 32), np.uint32)  # 2 bits an entry, 32-bit words
    assert codecs.TWO_BIT.payload_bytes(entries) == words.nbytes
    k = max(1, math.ceil(ratio * entries))
    pairs = np.zeros(k, value_dtype).nbytes + np.zeros(k, np.int32).nbytes
    value_bytes = np.dtype(value_dtype).itemsize
    for sparse in (codecs.TOPK, codecs.THRESHOLD):
        assert sparse.payload_bytes(entries, ratio, value_bytes) == pairs


@pytest.mark.parametrize("mode", codecs.MODES)
def test_what_a_communication_says_of_its_codec(mode):
    allreduce = AllreduceConfig(compression=mode)
    communication = Communication(allreduce, SyncConfig())
    assert communication.codec is codecs.of(mode) is allreduce.codec
    assert communication.encoded == (mode in codecs.ENCODED)
    assert communication.summary().startswith(codecs.of(mode).describe(allreduce))
    elastic_ok = mode != codecs.FP16.name
    assert communication.survives_resets == elastic_ok
