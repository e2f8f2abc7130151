"""A headline is shown by the cell that measured it and read back, figures intact, from its output."""

from __future__ import annotations

import json
from pathlib import Path

import IPython.display
import pytest
import torch

from tutorial_utils.display.headlines import read_headlines, record_headline


def recorded(monkeypatch: pytest.MonkeyPatch, key: str, text: str, **figures: object) -> dict:
    """The output record_headline hands to IPython's display, as a notebook would store it."""
    shown: list[dict] = []
    monkeypatch.setattr(IPython.display, "display", lambda data, raw: shown.append(data))
    record_headline(key, text, **figures)  # type: ignore[arg-type]
    (data,) = shown
    return {"output_type": "display_data", "data": json.loads(json.dumps(data)), "metadata": {}}


def test_a_recorded_headline_reads_back_from_the_notebook(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    output = recorded(
        monkeypatch, "chain_time", "x1.3 CPU time", cpu_time_ratio=1.31, beyond_noise=True,
        kept=torch.tensor(7),  # a 0-d tensor becomes its number
    )  # fmt: skip
    assert output["data"]["text/plain"] == "x1.3 CPU time"
    notebook = {"cells": [{"cell_type": "code", "source": [], "outputs": [output]}]}
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(notebook), encoding="utf-8")
    headline = read_headlines(path)["chain_time"]
    assert headline["figures"] == {"cpu_time_ratio": 1.31, "beyond_noise": True, "kept": 7}
    notebook["cells"].append(notebook["cells"][0])
    path.write_text(json.dumps(notebook), encoding="utf-8")
    with pytest.raises(ValueError, match="recorded twice"):
        read_headlines(path)


@pytest.mark.parametrize(
    ("key", "figures", "message"),
    [
        ("peak mib", {}, "Python identifier"),
        ("peak", {"peak_mib": float("nan")}, "not a finite number"),
        ("peak", {"peak_mib": [1.0, 2.0]}, "give a number, bool or str"),
    ],
)
def test_a_headline_refuses_what_a_page_cannot_show(
    monkeypatch: pytest.MonkeyPatch, key: str, figures: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        recorded(monkeypatch, key, "text", **figures)
