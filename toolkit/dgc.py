"""Deep Gradient Compression's techniques (Lin et al., ICLR 2018) as a config's ``allreduce:``
section turns them on: each given, or, where it is not, as ``dgc: true`` presets it
(:data:`PRESET`). What :mod:`toolkit.parallel.compression` does with each is said there; which
options they need is the section's rule (:func:`toolkit.sections.check_encoding`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from toolkit import codecs


@dataclasses.dataclass(frozen=True)
class Techniques:
    """Deep Gradient Compression's techniques (Lin et al., ICLR 2018), each on or off, for the
    encoded modes: what :mod:`toolkit.parallel.compression` does with each is said there."""

    momentum_correction: bool = False
    momentum_masking: bool = False
    local_clipnorm: float = 0.0
    sparsity_warmup_epochs: int = 0
    dense_1d: bool = False

    @classmethod
    def of(cls, allreduce: Any) -> Techniques:
        """Each technique as the ``allreduce`` section (or its mapping) gives it, or where it
        does not (``None``), as :data:`PRESET` has it if ``dgc`` is on, else off. The preset
        warms up ``topk`` only."""
        options = allreduce if isinstance(allreduce, Mapping) else allreduce.model_dump()
        default = OFF
        if options.get("dgc"):
            warms_up = codecs.of(options.get("compression", codecs.DENSE.name)).warms_up
            default = PRESET if warms_up else PRESET_UNWARMED
        return cls(
            **{
                name: getattr(default, name) if options.get(name) is None else options[name]
                for name in NAMES
            }
        )

    def words(self) -> list[str]:
        """The techniques that are on, as a summary names them."""
        return [
            text
            for text, shown in (
                ("momentum correction", self.momentum_correction),
                ("masking", self.momentum_masking),
                (f"local clip {self.local_clipnorm:g}", self.local_clipnorm),
                (f"warm-up {self.sparsity_warmup_epochs} epochs", self.sparsity_warmup_epochs),
                ("1-D dense", self.dense_1d),
            )
            if shown
        ]


NAMES = tuple(field.name for field in dataclasses.fields(Techniques))
OFF = Techniques()
PRESET = Techniques(True, True, 5.0, 4, True)
"""DGC's techniques as ``dgc: true`` sets them: the paper's four-epoch warm-up; its reference
implementation's dense 1-D variables; the clipping norm is the lab's choice (the paper clips at
the dense run's threshold scaled by ``workers ** -0.5``)."""
PRESET_UNWARMED = dataclasses.replace(PRESET, sparsity_warmup_epochs=0)
