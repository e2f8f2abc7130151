"""Every lesson's sizes come from one function of the profile, for every profile.

A notebook that keeps its own table keyed by profile name crashes in the profile the table
forgot (notebook 02 once had no ``gpu`` key). So each lesson exposes ``sizes_for(profile)``, this
test calls it for ``ci``, ``cpu``, ``gpu`` and ``article``, plain and under the ``TUTORIAL_STEPS``
rehearsal cap, and no notebook cell branches on the profile's name.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import pkgutil
import re
from pathlib import Path

import pytest

import tutorial_utils.lessons
from tutorial_utils.articles.profiles import PROFILES

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PROFILE_KEYED = re.compile(r"""PROFILE\.name\s*(==|!=|\]|in\b)|["'](ci|cpu|gpu|article)["']\s*:""")


def lesson_sizers() -> dict[str, object]:
    found = {}
    for module in pkgutil.walk_packages(tutorial_utils.lessons.__path__, "tutorial_utils.lessons."):
        imported = importlib.import_module(module.name)
        sizer = getattr(imported, "sizes_for", None)
        if sizer is not None and sizer.__module__ == imported.__name__:
            found[module.name] = sizer
    return found


def code_cells(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


PROFILE_VARIANTS = [
    *(pytest.param(profile, id=name) for name, profile in PROFILES.items()),
    *(
        pytest.param(profile.with_steps_cap(2), id=f"{name}-steps2")
        for name, profile in PROFILES.items()
    ),
]


@pytest.mark.parametrize("profile", PROFILE_VARIANTS)
def test_every_lesson_sizes_every_profile(profile) -> None:
    sizers = lesson_sizers()
    assert sizers, "no lesson defines sizes_for(profile)"
    for name, sizes_for in sizers.items():
        sizes = sizes_for(profile)
        assert dataclasses.is_dataclass(sizes), f"{name}.sizes_for returned {type(sizes)}"
        for field in dataclasses.fields(sizes):
            value = getattr(sizes, field.name)
            if field.name == "seed":  # a seed is not a size: 0 is a valid one
                continue
            if isinstance(value, int) and not isinstance(value, bool):
                assert value > 0, f"{name}.sizes_for({profile.name}).{field.name} = {value}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_notebook_cell_keys_sizes_by_profile_name(path: Path) -> None:
    offending = [src.splitlines()[0] for src in code_cells(path) if PROFILE_KEYED.search(src)]
    assert not offending, f"{path.name}: move these sizes into its lesson's sizes_for: {offending}"
