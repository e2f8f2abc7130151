"""Panels compute only when asked, pass the control values through, and redraw their output."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import pytest

from tutorial_utils.display.widgets import (
    WIDGET_VIEW_MIME,
    RunPanel,
    batch_size_slider,
    budget_slider,
    result_outputs,
    segment_slider,
)

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parent.parent


def memory_view(segments: int, batch_size: int, budget_mib: float):
    """A compute function of the kind notebooks pass: a figure (pyplot-managed) and a line."""
    fig, ax = plt.subplots()
    ax.bar(["budget", "need"], [budget_mib, batch_size * (10 - segments)])
    return fig, f"segments={segments} batch={batch_size} budget={budget_mib:.0f} MiB"


def make_panel(calls: list) -> RunPanel:
    def compute(**values):
        calls.append(values)
        return memory_view(**values)

    controls = {
        "segments": segment_slider(9, value=2),
        "batch_size": batch_size_slider(max_batch=32, value=8),
        "budget_mib": budget_slider(max_mib=100, value=40),
    }
    return RunPanel(controls, compute, title="memory against segments")


def test_sliders_start_where_asked():
    assert (segment_slider(10).value, segment_slider(10).max) == (0, 10)
    assert batch_size_slider(max_batch=64, value=16).value == 16
    assert budget_slider(max_mib=2560, value=2560, step_mib=10).value == 2560


@pytest.mark.parametrize(
    "make",
    [
        lambda: segment_slider(0),
        lambda: segment_slider(4, value=5),
        lambda: batch_size_slider(max_batch=4, value=8),
        lambda: budget_slider(max_mib=10, value=20),
    ],
)
def test_slider_bad_ranges_are_clear_errors(make):
    with pytest.raises(ValueError, match="need"):
        make()


def test_run_panel_computes_on_run_only_and_redraws():
    calls = []
    panel = make_panel(calls)
    assert calls == [] and panel.output.outputs == ()
    figures_before = set(plt.get_fignums())

    panel.run()
    assert calls == [{"segments": 2, "batch_size": 8, "budget_mib": 40.0}]
    image, text = panel.output.outputs
    assert base64.b64decode(image["data"]["image/png"]).startswith(b"\x89PNG")
    assert text["text"].startswith("segments=2 batch=8")
    assert set(plt.get_fignums()) == figures_before  # the figure was closed after display

    panel.controls["segments"].value = 5
    assert "click Run" in panel.status.value and len(calls) == 1  # no recompute on change
    panel.button.click()  # what the Run button does
    assert calls[-1]["segments"] == 5
    assert panel.output.outputs[1]["text"].startswith("segments=5")
    assert panel.runs == 2 and not panel.button.disabled


def test_run_panel_shows_errors_and_recovers():
    def compute(segments):
        if segments > 3:
            raise ValueError("segments=4 is out of range")
        return "fine"

    panel = RunPanel({"segments": segment_slider(8, value=4)}, compute)
    with pytest.raises(ValueError):
        panel.run()
    (error,) = panel.output.outputs
    assert error["name"] == "stderr" and "out of range" in error["text"]
    assert not panel.button.disabled
    panel.button.click()  # a click shows the error instead of raising into the front end
    panel.controls["segments"].value = 1
    panel.run()
    assert panel.output.outputs[0]["text"] == "fine\n"


def test_result_outputs_accept_figure_text_or_both():
    fig, _ = plt.subplots()
    assert [o["output_type"] for o in result_outputs(fig)] == ["display_data"]
    assert [o["output_type"] for o in result_outputs(("a", None))] == ["stream"]


def test_a_run_whose_result_cannot_be_drawn_says_so(monkeypatch):
    """An error while drawing the result (an unreadable figure, say) is shown like a failed
    compute, not left behind a 'running...' status."""
    from tutorial_utils.display import widgets as panel_widgets

    def refuse(_figure):
        raise ValueError("figure is hard to read")

    monkeypatch.setattr(panel_widgets, "figure_output", refuse)
    figure, _ = plt.subplots()
    panel = panel_widgets.RunPanel({}, lambda: figure)
    with pytest.raises(ValueError, match="hard to read"):
        panel.run()
    assert panel.status.value == "failed (see below)" and not panel.button.disabled
    assert "hard to read" in panel.output.outputs[0]["text"]
    plt.close(figure)


def test_a_panel_leaves_a_picture_of_its_first_result_beside_the_widget():
    panel = make_panel([])
    before = panel.widget._repr_mimebundle_()
    assert WIDGET_VIEW_MIME in before and "image/png" not in before  # nothing run: no picture
    panel.run()
    first = panel.widget._repr_mimebundle_()["image/png"]
    assert base64.b64decode(first).startswith(b"\x89PNG")
    panel.controls["segments"].value = 3
    panel.run()
    assert panel.widget._repr_mimebundle_()["image/png"] == first  # the first result's picture


# notebooks whose committed panels must show an image on a static page; the lead extends it
PANELS_WITH_PICTURES = {"01", "02", "03", "04", "05", "06", "07"}


@pytest.mark.parametrize(
    "path", sorted((ROOT / "notebooks").glob("0*.ipynb")), ids=lambda path: path.stem
)
def test_no_committed_panel_is_only_widget_text(path: Path):
    """GitHub cannot draw a widget: a widget output must carry an image beside its text."""
    if path.stem[:2] not in PANELS_WITH_PICTURES:
        pytest.skip("panels not yet re-run with pictures (PANELS_WITH_PICTURES)")
    notebook = json.loads(path.read_text(encoding="utf-8"))
    bare = [
        f"cell {index}: {''.join(output['data'].get('text/plain', ''))[:60]}"
        for index, cell in enumerate(notebook["cells"])
        for output in cell.get("outputs", [])
        if WIDGET_VIEW_MIME in output.get("data", {}) and "image/png" not in output["data"]
    ]
    assert not bare, f"{path.name}: widget outputs without a picture:\n" + "\n".join(bare)
