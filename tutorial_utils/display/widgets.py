"""Widget panels the notebooks share: sliders, and a Run button that starts the expensive work.

The work itself is a plain function of the control values (``compute(**values)``), so tests call
it, and ``RunPanel.run()``, without a browser. Only ipywidgets APIs that 7.7 and 8 share are used.
Results are written into the Output widget's ``outputs`` directly (a PNG per figure, text as a
stream), which needs no kernel-side capture and renders the same in JupyterLab, Notebook and Colab.
A panel is a ``PanelBox``: its output also carries a PNG of its first result, which a page
without a kernel (GitHub, nbviewer) shows where it would otherwise print ``VBox(...)``.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Mapping
from typing import Any

import ipywidgets as widgets
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

__all__ = [
    "batch_size_slider",
    "budget_slider",
    "figure_output",
    "int_slider",
    "result_outputs",
    "RunPanel",
    "segment_slider",
    "wide_layout",
]

WIDE_LABEL = {"description_width": "initial"}
WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"


def wide_layout() -> widgets.Layout:
    """A fresh layout that leaves the slider track room beside a long label."""
    return widgets.Layout(width="100%", max_width="640px")


def int_slider(description: str, value: int, low: int, high: int) -> widgets.IntSlider:
    """An integer slider that acts on release (each change may start a measurement)."""
    return widgets.IntSlider(
        value=value,
        min=low,
        max=high,
        step=1,
        description=description,
        continuous_update=False,
        style=WIDE_LABEL,
        layout=wide_layout(),
    )


def segment_slider(
    max_segments: int, value: int = 0, description: str = "checkpoint segments"
) -> widgets.IntSlider:
    """0..max_segments; 0 (and 1) mean no checkpointing."""
    if max_segments < 1 or not 0 <= value <= max_segments:
        raise ValueError(
            f"need max_segments >= 1 and 0 <= value <= max_segments, got {max_segments}, {value}"
        )
    return int_slider(description, value, 0, max_segments)


def batch_size_slider(
    max_batch: int = 64, value: int = 8, min_batch: int = 1, description: str = "batch size"
) -> widgets.IntSlider:
    """Batch sizes min_batch..max_batch."""
    if not 1 <= min_batch <= value <= max_batch:
        raise ValueError(
            f"need 1 <= min_batch <= value <= max_batch, got {min_batch}, {value}, {max_batch}"
        )
    return int_slider(description, value, min_batch, max_batch)


def budget_slider(
    max_mib: float,
    value: float,
    min_mib: float = 1.0,
    step_mib: float = 1.0,
    description: str = "memory budget (MiB)",
) -> widgets.FloatSlider:
    """A memory budget in MiB (multiply by 2**20 for bytes)."""
    if not 0 < min_mib <= value <= max_mib or step_mib <= 0:
        raise ValueError(
            f"need 0 < min_mib <= value <= max_mib and step_mib > 0, got {min_mib}, {value}, {max_mib}, {step_mib}"
        )
    return widgets.FloatSlider(
        value=value,
        min=min_mib,
        max=max_mib,
        step=step_mib,
        description=description,
        continuous_update=False,
        readout_format=".0f",
        style=WIDE_LABEL,
        layout=wide_layout(),
    )


def figure_output(figure: Figure, dpi: int = 90) -> dict[str, Any]:
    """A figure as a notebook display_data output (PNG); the figure is closed afterwards."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(figure)  # pyplot-managed figures would otherwise accumulate
    return {
        "output_type": "display_data",
        "data": {
            "image/png": base64.b64encode(buffer.getvalue()).decode("ascii"),
            "text/plain": "<Figure>",
        },
        "metadata": {},
    }


def text_output(text: str, name: str = "stdout") -> dict[str, Any]:
    """Text as a notebook stream output (monospaced, so tables stay aligned)."""
    return {
        "output_type": "stream",
        "name": name,
        "text": text if text.endswith("\n") else text + "\n",
    }


def result_outputs(result: Any) -> tuple[dict[str, Any], ...]:
    """Notebook outputs for what a compute function returns: a Figure, a str, or a tuple of them."""
    items = result if isinstance(result, tuple | list) else (result,)
    outputs = []
    for item in items:
        if item is None:
            continue
        outputs.append(figure_output(item) if isinstance(item, Figure) else text_output(str(item)))
    return tuple(outputs)


class PanelBox(widgets.VBox):
    """A panel's box: the live widget where a kernel runs, a picture of its first result elsewhere.

    Its output holds the widget view, a PNG and a line of text. JupyterLab and Colab draw the
    widget (their widget renderer ranks above images); GitHub and nbviewer cannot, and show the
    PNG instead of the text ``VBox(...)``.
    """

    def __init__(self, children: list[widgets.Widget], **kwargs: Any) -> None:
        super().__init__(children, **kwargs)
        self.picture_png: str | None = None

    def keep_picture(self, outputs: tuple[dict[str, Any], ...]) -> None:
        """Keep the first figure of the first result that has one (later results change nothing)."""
        if self.picture_png is None:
            pictures = [out["data"]["image/png"] for out in outputs if "data" in out]
            self.picture_png = pictures[0] if pictures else None

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        view = {"version_major": 2, "version_minor": 0, "model_id": self.model_id}
        bundle: dict[str, Any] = {
            WIDGET_VIEW_MIME: view,
            "text/plain": "a panel: run the notebook to use its controls",
        }
        if self.picture_png is not None:
            bundle["image/png"] = self.picture_png
        return bundle

    def _ipython_display_(self, **kwargs: Any) -> None:  # ipywidgets 7.7 (Colab) looks here first
        from IPython.display import display

        display(self._repr_mimebundle_(), raw=True)


class RunPanel:
    """Controls, a Run button and an output area; ``compute(**values)`` runs on click only.

    ``controls`` maps ``compute``'s keyword names to value widgets. Changing a control marks the
    shown result as stale instead of recomputing it, since a step can take seconds or minutes.
    Display ``panel.widget``; call ``panel.run()`` to compute from code or tests.
    """

    def __init__(
        self,
        controls: Mapping[str, widgets.ValueWidget],
        compute: Callable[..., Any],
        title: str = "",
        button_description: str = "Run",
    ):
        self.controls = dict(controls)
        self.compute = compute
        self.runs = 0
        self.last_result: Any = None
        self.button = widgets.Button(description=button_description, button_style="primary")
        self.status = widgets.Label(value="click Run to compute")
        self.output = widgets.Output()
        header = [widgets.HTML(value=f"<b>{title}</b>")] if title else []
        self.widget = PanelBox(
            [
                *header,
                *self.controls.values(),
                widgets.HBox([self.button, self.status]),
                self.output,
            ]
        )
        self.button.on_click(self._on_click)
        for control in self.controls.values():
            control.observe(self._mark_stale, names="value")

    def values(self) -> dict[str, Any]:
        """The controls' current values, by keyword."""
        return {name: control.value for name, control in self.controls.items()}

    def run(self) -> Any:
        """Compute from the current values and redraw the output; errors are shown, then raised."""
        self.button.disabled = True
        self.status.value = "running..."
        try:
            result = self.compute(**self.values())
            outputs = result_outputs(result)  # drawing can fail too: shown like a failed compute
        except Exception as error:
            self.output.outputs = (text_output(f"{type(error).__name__}: {error}", "stderr"),)
            self.status.value = "failed (see below)"
            raise
        finally:
            self.button.disabled = False
        self.output.outputs = outputs
        self.widget.keep_picture(outputs)
        self.runs += 1
        self.last_result = result
        self.status.value = f"done (run {self.runs})"
        return result

    def _on_click(self, _button: widgets.Button) -> None:
        try:
            self.run()
        except Exception:  # already shown in the output area
            pass

    def _mark_stale(self, _change: dict) -> None:
        if self.runs:
            self.status.value = "controls changed: click Run to update"
