"""The notebook door: JupyterLab for ``notebooks/``, started by ``./lab notebook``.

``python -m toolkit notebook [JUPYTERLAB ARGS]`` registers this environment as the Jupyter
kernel "Large-Batch Lab" and starts JupyterLab in ``notebooks/`` with it as every notebook's
kernel. The rules, each enforced here whatever else is asked:

- The server listens on 127.0.0.1 only. An ``--ip`` that is not a loopback address is refused.
- Token authentication is always on: Jupyter's own random token, printed in the URL it shows
  at start, or ``$JUPYTER_TOKEN`` if set. An empty token or password on the command line is
  refused. (Your own Jupyter config files are read as usual: keep any token there non-empty.)
- Figures draw offline. The kernel fixes Plotly's renderer to :data:`PLOTLY_RENDERER`, drawn
  by the JupyterLab extension that ships inside the Plotly wheel: no CDN, no internet. Notebooks
  set nothing themselves.

Other arguments pass through to JupyterLab (``--port=8890``, ``--no-browser``, ...).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from toolkit.launching.remote import PACKAGE_ROOT

KERNEL_NAME = "large-batch-lab"
KERNEL_DISPLAY_NAME = "Large-Batch Lab"
PLOTLY_RENDERER = "plotly_mimetype"
NOTEBOOKS = PACKAGE_ROOT / "notebooks"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
_SECRETS = ("token", "password", "hashed_password")  # options that must never be empty


class UnsafeArgument(ValueError):
    """A JupyterLab argument that would open the server to others."""


def install_kernel(prefix: str | os.PathLike = sys.prefix) -> Path:
    """Register this interpreter as the kernel :data:`KERNEL_NAME` under ``prefix`` (by default
    the virtual environment, where its ``jupyter`` looks first) and return the spec's folder.
    Idempotent: the spec is rewritten each time, so it follows the environment it points at."""
    from ipykernel.kernelspec import install

    folder = install(
        kernel_name=KERNEL_NAME,
        display_name=KERNEL_DISPLAY_NAME,
        prefix=str(prefix),
        env={"PLOTLY_RENDERER": PLOTLY_RENDERER},
    )
    return Path(folder)


def check_arguments(args: list[str]) -> None:
    """Raise :class:`UnsafeArgument` for an address that is not loopback, or an empty token or
    password, in either spelling (``--ip=X`` or ``--ip X``, and any ``--Class.trait``)."""
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        name, has_value, value = arg[2:].partition("=")
        if not has_value:
            value = args[i + 1] if i + 1 < len(args) else ""
            arg = f"{arg} {value}".strip()
        trait = name.rsplit(".", 1)[-1].lower()
        value = value.strip().strip("'\"")
        if trait == "ip" and value not in LOOPBACK:
            raise UnsafeArgument(
                f"{arg}: the notebook server listens on 127.0.0.1 only "
                f"(allowed: {', '.join(LOOPBACK)}); reach it remotely through an SSH tunnel"
            )
        if trait in _SECRETS and not value:
            raise UnsafeArgument(f"{arg}: an empty {trait} would let anyone on this machine in")


def server(
    args: list[str] = (), *, root_dir: str | os.PathLike = NOTEBOOKS, token: str | None = None
) -> tuple[list[str], dict[str, str]]:
    """The command and environment that start JupyterLab in ``root_dir`` on the rules above,
    with ``args`` passed through (checked first: raises :class:`UnsafeArgument`). A ``token``
    goes to the server through its environment, where only this user can read it."""
    args = list(args)
    check_arguments(args)
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        f"--ServerApp.root_dir={Path(root_dir).resolve()}",
        "--ServerApp.ip=127.0.0.1",
        f"--MappingKernelManager.default_kernel_name={KERNEL_NAME}",
        *(["--allow-root"] if os.geteuid() == 0 else []),  # containers: root is the only user
        *args,
    ]
    return command, {**os.environ, **({"JUPYTER_TOKEN": token} if token else {})}


def private_dirs(base: str | os.PathLike) -> dict[str, str]:
    """Environment variables that move JupyterLab's config, runtime, settings and workspaces
    under ``base``, so a server started for a test or a picture leaves the user's own alone."""
    folders = {
        "JUPYTER_CONFIG_DIR": "config",
        "JUPYTER_RUNTIME_DIR": "runtime",
        "JUPYTERLAB_SETTINGS_DIR": "settings",
        "JUPYTERLAB_WORKSPACES_DIR": "workspaces",
    }
    return {name: str(Path(base) / folder) for name, folder in folders.items()}


def main(args: list[str]) -> None:
    """``./lab notebook``: register the kernel, then become the JupyterLab server."""
    command, env = server(args)
    install_kernel()
    os.execve(command[0], command, env)
