"""Re-execute notebooks in place so their committed outputs come from one complete, known run.

Each notebook is stamped (Colab URLs), then run top to bottom by this environment's Python kernel
with ``TUTORIAL_PROFILE`` set; its first cell prints the profile and hardware. Every figure is
checked for readability on the way (``TUTORIAL_CHECK_FIGURES``, see display/figure_check.py). A notebook that
raises is left untouched on disk, so a committed notebook never carries an error.

Usage: python scripts/execute_notebooks.py [--profile ci|cpu|gpu|article] [notebooks...]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import ipykernel.kernelspec
import nbformat
from hide_solutions import hide_solutions
from jupyter_client import AsyncKernelManager
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_core.utils import run_sync
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
from stamp_colab import notebook_paths, repository_url, stamp_notebook

from tutorial_utils.articles.profiles import PROFILE_ENV, PROFILES, default_profile_name
from tutorial_utils.display.figure_check import CHECK_FIGURES_ENV


class CurrentEnvKernelSpecs(KernelSpecManager):
    """Always this interpreter's ipykernel, whatever kernels the user has installed elsewhere."""

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return KernelSpec(
            resource_dir=ipykernel.kernelspec.RESOURCES, **ipykernel.kernelspec.get_kernel_dict()
        )


def run_notebook(
    notebook: nbformat.NotebookNode,
    folder: Path,
    env: Mapping[str, str],
    *,
    cell_timeout: int | None = None,
    deadline: float | None = None,
) -> None:
    """Run every cell of ``notebook`` in place, in this interpreter's kernel started in ``folder``
    with the environment ``env``. ``deadline`` (a ``time.monotonic()`` value) bounds the whole
    notebook: each cell may take only the time left. Raises nbclient's errors on a failing cell."""
    # Asynchronous, as nbclient expects: with a blocking KernelManager cell timeouts never fire.
    kernel = AsyncKernelManager(kernel_name="python3", kernel_spec_manager=CurrentEnvKernelSpecs())

    def time_left(cell: nbformat.NotebookNode) -> int | None:
        if deadline is None:
            return cell_timeout
        left = max(1, math.ceil(deadline - time.monotonic()))
        return left if cell_timeout is None else min(left, cell_timeout)

    client = NotebookClient(
        notebook,
        km=kernel,
        timeout_func=time_left,
        coalesce_streams=True,  # one stream per cell; progress bars keep only their final line
        resources={"metadata": {"path": str(folder)}},
    )
    try:
        client.execute(env=dict(env))
    finally:
        if kernel.has_kernel:  # nbclient leaves a kernel it was handed running
            run_sync(kernel.shutdown_kernel)()


def execute_notebook(path: Path, repo_url: str, cell_timeout: int | None) -> None:
    """Stamp and run one notebook; write it back only when every cell succeeded, with the
    solutions' answers behind a click (scripts/hide_solutions.py)."""
    notebook = nbformat.read(path, as_version=4)
    problems = stamp_notebook(notebook, path.name, repo_url)
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    run_notebook(notebook, path.parent, os.environ, cell_timeout=cell_timeout)
    hide_solutions(notebook)
    nbformat.write(notebook, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default=os.environ.get(PROFILE_ENV) or default_profile_name(),
        help="experiment sizes (default: $TUTORIAL_PROFILE, else cpu, or gpu with CUDA)",
    )
    parser.add_argument(
        "--cell-timeout", type=int, default=None, help="seconds per cell (default: no limit)"
    )
    parser.add_argument("notebooks", nargs="*", help="default: notebooks/*.ipynb")
    args = parser.parse_args(argv)
    os.environ[PROFILE_ENV] = args.profile
    os.environ.pop("MPLBACKEND", None)  # the kernel's inline backend stores figures as outputs
    os.environ.setdefault(CHECK_FIGURES_ENV, "1")  # a committed figure is a readable one
    repo_url = repository_url()
    failed = []
    for path in notebook_paths(args.notebooks):
        print(f"{path} (profile {args.profile}) ...", flush=True)
        started = time.perf_counter()
        try:
            execute_notebook(path, repo_url, args.cell_timeout)
        except (CellExecutionError, CellTimeoutError, DeadKernelError, ValueError) as error:
            print(f"{path}: FAILED, left unchanged:\n{error}", file=sys.stderr)
            failed.append(path)
            continue
        print(f"{path}: done in {time.perf_counter() - started:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
