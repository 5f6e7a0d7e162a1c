"""scripts/setup.sh's choice of build: CPU or GPU, from ``nvidia-smi`` and ``LBL_GPU``.

``setup.sh --detect`` decides and says why, and does nothing else. Each case runs it with a
``PATH`` that holds only the few commands it needs, and a fake ``nvidia-smi`` where the case
has one, so the machine's own drivers (or their absence) do not decide.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parents[1] / "scripts" / "setup.sh"
TWO_GPUS = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)"
NO_DRIVER = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."


def detect(tmp_path: Path, nvidia_smi: tuple[str, int] | None, lbl_gpu: str | None = None):
    """``setup.sh --detect`` on a PATH of ``tmp_path/bin``: links to ``dirname`` and ``grep``,
    and ``nvidia-smi`` printing ``nvidia_smi[0]`` and exiting ``nvidia_smi[1]`` when given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "grep"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    if nvidia_smi is not None:
        text, code = nvidia_smi
        fake = bin_dir / "nvidia-smi"
        lines = " ".join(shlex.quote(line) for line in text.splitlines())
        fake.write_text(
            f"#!/bin/bash\n[[ $1 == -L ]] || exit 9\nprintf '%s\\n' {lines}\nexit {code}\n"
        )
        fake.chmod(0o755)
    env = {"PATH": str(bin_dir), "HOME": os.environ["HOME"]}
    if lbl_gpu is not None:
        env["LBL_GPU"] = lbl_gpu
    return subprocess.run(
        ["/bin/bash", str(SETUP), "--detect"], env=env, capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize(
    "nvidia_smi, lbl_gpu, expected",
    [
        (None, None, "cpu (no nvidia-smi on PATH)"),
        ((TWO_GPUS, 0), None, "gpu (nvidia-smi lists 2 GPUs)"),
        ((NO_DRIVER, 9), None, "cpu (nvidia-smi lists 0 GPUs)"),
        (("No devices were found", 6), None, "cpu (nvidia-smi lists 0 GPUs)"),
        ((TWO_GPUS, 0), "0", "cpu (LBL_GPU=0)"),
        (None, "1", "gpu (LBL_GPU=1)"),
        ((NO_DRIVER, 9), "1", "gpu (LBL_GPU=1)"),
    ],
    ids=[
        "no-nvidia-smi",
        "two-gpus",
        "driver-fails",
        "no-devices",
        "forced-cpu",
        "forced-gpu",
        "forced-gpu-without-driver",
    ],
)
def test_setup_chooses_the_build_from_nvidia_smi_unless_lbl_gpu_says(
    tmp_path, nvidia_smi, lbl_gpu, expected
):
    result = detect(tmp_path, nvidia_smi, lbl_gpu)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


def test_setup_refuses_an_lbl_gpu_it_does_not_know_before_doing_anything(tmp_path):
    result = detect(tmp_path, (TWO_GPUS, 0), "yes")
    assert result.returncode != 0
    assert "LBL_GPU must be 1 (the GPU build) or 0 (the CPU build)" in result.stderr
    assert "got 'yes'" in result.stderr
    assert result.stdout == ""


def test_setup_refuses_an_unknown_argument(tmp_path):
    result = subprocess.run(
        ["/bin/bash", str(SETUP), "--gpu"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "usage: scripts/setup.sh [--test | --detect]" in result.stderr


def test_the_launch_queue_counts_the_gpus_setup_builds_for(tmp_path, monkeypatch):
    """One rule for both: where setup.sh builds for GPUs, the queue's capacity is the GPU
    count (one process per GPU)."""
    from toolkit.launching import slots

    assert detect(tmp_path, (TWO_GPUS, 0)).stdout.startswith("gpu")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    slots.local_slots.cache_clear()
    try:
        assert slots.local_slots() == 2
    finally:
        slots.local_slots.cache_clear()
