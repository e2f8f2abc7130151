"""The first cell of every notebook: say where and at what scale it runs."""

from __future__ import annotations

import logging
import os
import platform
import warnings

import torch
import torchvision

from tutorial_utils.articles.profiles import Profile, get_profile
from tutorial_utils.display.figure_check import CHECK_FIGURES_ENV, check_figures_when_shown
from tutorial_utils.measurement.devices import default_device, describe_device, mps_status

__all__ = [
    "OLD_NAME_WARNING",
    "OLD_NAME_WARNING_MODULE",
    "QUIETED_LOGGERS",
    "ipywidgets_version",
    "report_environment",
]

# bitsandbytes (imported by peft) warns on some CPUs that an optional kernel package is missing;
# no notebook runs its CPU kernels (07's nf4 estimate emulates them on meta).
QUIETED_LOGGERS = ("bitsandbytes.backends.cpu.ops",)
# peft 0.21's QLoRA preparation calls transformers' old method name, which 5.23 and later answer
# with this FutureWarning: a learner's code did nothing wrong. Only this message from this module
# is quieted; the tutorial calls the new name wherever it exists, and 06's cell that shows the
# message records warnings with simplefilter("always"), which overrides the filter.
OLD_NAME_WARNING = r"`gradient_checkpointing_enable` is deprecated and will be removed"
OLD_NAME_WARNING_MODULE = r"transformers\.modeling_utils"


def ipywidgets_version() -> str:
    """The installed ipywidgets version, or 'not installed'."""
    try:
        import ipywidgets
    except ImportError:
        return "not installed"
    return ipywidgets.__version__


def report_environment(profile_name: str | None = None) -> Profile:
    """Print profile, device (and, on a Mac, whether Apple's GPU is usable) and versions; return
    the active profile. Warnings of ``QUIETED_LOGGERS`` are silenced, their errors kept, and so is
    the ``OLD_NAME_WARNING`` that peft's QLoRA preparation triggers.

    With ``TUTORIAL_CHECK_FIGURES=1`` (set by the test command) every figure the notebook shows
    afterwards is checked for overlapping labels and clipped data, and an unreadable one fails.
    """
    profile = get_profile(profile_name)
    for name in QUIETED_LOGGERS:  # errors still show
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", OLD_NAME_WARNING, FutureWarning, OLD_NAME_WARNING_MODULE)
    if os.environ.get(CHECK_FIGURES_ENV) == "1":
        check_figures_when_shown()
    print(f"profile: {profile.name} ({profile.description})")
    print(f"device:  {describe_device(default_device())}")
    apple_gpu = mps_status()
    if apple_gpu is not None:  # on a Mac only: the cpu profile stays the default there
        print(f"         {apple_gpu}")
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, "
        f"torchvision {torchvision.__version__}, ipywidgets {ipywidgets_version()}"
    )
    return profile
