"""The README's "Use it on your own model" block runs as printed, so it cannot rot."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_example() -> str:
    text = README.read_text()
    section = text.split("## Use it on your own model", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README's 'Use it on your own model' section lost its python block"
    return match.group(1)


def test_readme_example_runs_and_says_how_each_figure_was_obtained():
    printed = io.StringIO()
    namespace: dict = {}
    with contextlib.redirect_stdout(printed):
        exec(compile(readme_example(), str(README), "exec"), namespace)
    output = printed.getvalue()
    assert "measured: real step on cpu" in output
    assert namespace["plain"].source.startswith("dry run (meta device)")
    assert namespace["plain"].peak_bytes > 8 * 2**30  # a size this machine could not run
    assert (
        namespace["planned"].peak_bytes
        < namespace["four"].peak_bytes
        < namespace["plain"].peak_bytes
    )
    assert namespace["floor"].floor_bytes <= namespace["planned"].peak_bytes
    assert 0 < namespace["largest"].batch_size < 256
    assert "largest batch in 8 GiB" in output
