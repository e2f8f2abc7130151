"""Every notebook as a reader uses it: JupyterLab in headless Chromium, Run All, move the sliders.

This is the suite's one execution of each notebook (``ci`` profile, every figure checked for
readability). A notebook can run and still fail its readers: a widget that does not render in
JupyterLab, or a slider whose panel never updates. This test starts one JupyterLab server on a
throwaway copy of notebooks/ (so the committed notebooks are never touched), drives Debian's
Chromium through Playwright (no browser download), runs all cells, saves the notebook and applies
nbval's checks to that saved run (``tests/saved_run.py``: every cell ran without error, tagged
cells reproduce their committed output), then for every widget panel types a new value into a
slider's readout, presses Enter, clicks the panel's Run button and waits for its output to
change. Screenshots land in test-artifacts/screenshots/. Each notebook is its own unit of work,
longest recorded run first, so pytest-xdist runs them on both workers (``tests/schedule.py``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.saved_run import saved_run_problems

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
SERVER_START_TIMEOUT_S = 90
RUN_ALL_TIMEOUT_S = 600  # a guard, not a budget: 2 busy shared cores take minutes for some
# The first notebook a worker opens loads JupyterLab's and ipywidgets' scripts into a fresh
# browser while both workers, their imports and mypy start: a fresh-clone run (2026-12-04) saw
# 06's saved panel still unrendered after 60 s there, and rendered in time when 06 ran alone.
PANEL_TIMEOUT_S = 150
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
ERROR_TEXT = re.compile(r"Traceback \(most recent call last\)|^\w*(Error|Exception)\b", re.M)

# Editable, visible slider readouts: a contenteditable div in ipywidgets 8, a text input in 7.
READOUT = ".widget-readout[contenteditable='true']:visible, input.widget-readout:visible"

# True once the kernel is idle and every non-empty code cell shows an execution count, or a cell
# failed (Run All stops there and leaves the cells below unexecuted).
RUN_ALL_DONE_JS = """() => {
  const indicator = document.querySelector('.jp-Notebook-ExecutionIndicator');
  if (!indicator || indicator.dataset.status !== 'idle') return false;
  const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')];
  if (prompts.some(prompt => prompt.textContent.includes('*'))) return false;
  const stderr = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]';
  if (document.querySelector(stderr)) return true;
  return [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')].every(cell => {
    const source = cell.querySelector('.jp-InputArea-editor')?.textContent.trim() ?? '';
    const prompt = cell.querySelector('.jp-InputPrompt')?.textContent.trim() ?? '';
    return source === '' || /^\\[\\d+\\]:$/.test(prompt);
  });
}"""

# The notebook's kernel is started, connected and idle (the toolbar indicator alone also reads
# "idle" before any kernel exists, so the status bar's "Python 3 (ipykernel) | Idle" is needed).
KERNEL_IDLE_JS = """() =>
  document.querySelector('.jp-Notebook-ExecutionIndicator')?.dataset.status === 'idle'
  && [...document.querySelectorAll('.jp-StatusBar-TextItem')]
    .some(item => / \\| Idle$/.test(item.textContent) && !item.textContent.startsWith('No Kernel'))"""

# Clear Outputs took effect: no output and no execution count left from the stored run.
OUTPUTS_CLEARED_JS = """() =>
  !document.querySelector('.jp-Notebook .jp-CodeCell .jp-OutputArea-output')
  && [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')]
    .every(prompt => !/\\d/.test(prompt.textContent))"""

# Outputs that may report a failure: stderr (tracebacks land there) and widgets that did not
# render ("Error displaying widget: model not found").
ERROR_OUTPUTS_JS = """() => [
  ...[...document.querySelectorAll(
    '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
  )].map(e => e.innerText),
  ...[...document.querySelectorAll('.jp-OutputArea-output')]
    .map(e => e.innerText)
    .filter(t => t.includes('Error displaying widget')),
]"""

# Widget outputs shown as their text repr ("VBox(children=(...") instead of as widgets: what an
# untrusted notebook, or one whose saved widget state is missing, shows on first open.
WIDGET_REPR_JS = """() => [...document.querySelectorAll('.jp-OutputArea-output')]
  .map(e => e.innerText.trim())
  .filter(t => /^(VBox|HBox|IntSlider|FloatSlider|Dropdown|Output|Button)\\(/.test(t))"""

# Every image in cell `index`'s output has loaded and decoded (before that it shows as white space).
IMAGES_PAINTED_JS = """index => [...[...document.querySelectorAll('.jp-Notebook .jp-Cell')][index]
  .querySelectorAll('.jp-Cell-outputArea img')].every(img => img.complete && img.naturalWidth > 0)"""

# Indices of the cells whose output holds a slider with a visible, editable readout: the panels.
PANEL_CELLS_JS = """() => [...document.querySelectorAll('.jp-Notebook .jp-Cell')]
  .map((cell, index) => [...cell.querySelectorAll('.widget-slider .widget-readout')]
    .some(r => (r.isContentEditable || r.tagName === 'INPUT') && r.offsetParent !== null)
    ? index : -1)
  .filter(index => index >= 0)"""

# What a panel shows from cell `index` on: output widgets' and HTML widgets' text, and images.
PANEL_OUTPUT_JS = """index => {
  const cells = [...document.querySelectorAll('.jp-Notebook .jp-Cell')].slice(index);
  return cells.flatMap(cell => [
    ...[...cell.querySelectorAll('.widget-output, .widget-html, .widget-htmlmath')]
      .map(e => e.innerText),
    ...[...cell.querySelectorAll('.jp-Cell-outputArea img')].map(img => img.src),
  ]);
}"""


@dataclass
class LabServer:
    """A running JupyterLab: where to reach it and the process group to stop."""

    process: subprocess.Popen
    port: int
    token: str
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, path: str, method: str = "GET") -> object:
        request = urllib.request.Request(
            self.base_url + path, method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self) -> None:
        """Free the kernels' memory between notebooks (each holds torch and a model)."""
        for kernel in self.api("/api/kernels"):
            self.api(f"/api/kernels/{kernel['id']}", method="DELETE")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def port_is_open(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def descendant_pids(pid: int) -> set[int]:
    """All processes below `pid` (kernels run in their own sessions, so killpg misses them)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, stack = set(), [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.add(child)
            stack.append(child)
    return found


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def start_lab(workdir: Path) -> LabServer:
    """JupyterLab on 127.0.0.1, a free port and a random token, isolated from user settings."""
    root_dir = workdir / "notebooks"
    shutil.copytree(ROOT / "notebooks", root_dir, ignore=shutil.ignore_patterns(".*"))
    settings = workdir / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    # every cell rendered, not only those scrolled into view: a saved panel far down a notebook is
    # then in the page on first open, whatever the machine's load
    notebook_settings = workdir / "settings" / "@jupyterlab" / "notebook-extension"
    notebook_settings.mkdir(parents=True)
    (notebook_settings / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    env = {
        **os.environ,
        "TUTORIAL_PROFILE": "ci",
        "JUPYTER_CONFIG_DIR": str(workdir / "config"),
        "JUPYTER_DATA_DIR": str(workdir / "data"),
        "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
        "IPYTHONDIR": str(workdir / "ipython"),
    }
    # as ./scripts/lab does: trusted notebooks render their saved widget panels on first open
    subprocess.run(
        [sys.executable, "-m", "jupyter", "trust", *map(str, sorted(root_dir.glob("*.ipynb")))],
        env=env,
        check=True,
        capture_output=True,
    )
    env.pop("MPLBACKEND", None)  # the kernel's inline backend shows figures, as for a reader
    env["TUTORIAL_CHECK_FIGURES"] = "1"  # an unreadable figure fails its cell, as under nbval
    port, token = free_port(), secrets.token_hex(16)
    log = workdir / "jupyterlab.log"
    command = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        "--allow-root",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root_dir}",
        f"--LabApp.user_settings_dir={workdir / 'settings'}",
        f"--LabApp.workspaces_dir={workdir / 'workspaces'}",
    ]
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            command, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = LabServer(process, port, token, log)
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"JupyterLab exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            server.api("/api/status")
            return server
        except OSError:
            time.sleep(0.5)
    stop_lab(server)
    pytest.fail(f"JupyterLab did not answer within {SERVER_START_TIMEOUT_S} s:\n{log.read_text()}")


def stop_lab(server: LabServer) -> list[int]:
    """Stop kernels and server (terminate, wait, kill); return the pids that had to be killed."""
    spawned = descendant_pids(server.process.pid)
    try:
        server.shutdown_kernels()
    except OSError:
        pass  # the server is already gone; its leftovers are killed below
    try:
        os.killpg(server.process.pid, signal.SIGTERM)
        server.process.wait(timeout=20)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(timeout=10)
    leftovers = [pid for pid in spawned if pid_alive(pid)]
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    return leftovers


# One server and one browser per pytest-xdist worker for the whole session: the notebooks are
# spread over both workers between unit tests (tests/schedule.py), and a module scope would stop
# and restart them whenever a worker ran something else in between.
@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    server = start_lab(tmp_path_factory.mktemp("jupyterlab"))
    try:
        yield server
    finally:
        leftovers = stop_lab(server)
    assert not port_is_open(server.port), f"port {server.port} still open after stopping"
    assert not leftovers, f"processes left running after the server stopped: {leftovers}"


@pytest.fixture(scope="session")
def chromium_browser() -> Iterator[object]:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright missing: pip install -e '.[browser]'"
    )
    executable = shutil.which("chromium")
    if executable is None:
        pytest.skip("chromium missing: run scripts/ensure-chromium.sh (apt-get install chromium)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def committed_widget_models(notebook: Path) -> set[str]:
    """Widget models the notebook's committed run displayed (nbclient stores their state)."""
    metadata = json.loads(notebook.read_text(encoding="utf-8"))["metadata"]
    state = metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    return {model.get("model_name") for model in state.values()}


def click_menu(page, menu: str, item: str) -> None:
    """Use the menu bar as a reader does."""
    page.locator(".lm-MenuBar-item").get_by_text(menu, exact=True).click()
    page.locator(".lm-Menu-item").get_by_text(item, exact=True).click()


def assert_no_error_outputs(page, when: str) -> None:
    errors = [text for text in page.evaluate(ERROR_OUTPUTS_JS) if ERROR_TEXT.search(text)]
    assert not errors, f"error output {when}:\n" + "\n---\n".join(t[-2000:] for t in errors)


def run_all_and_check(page, lab: LabServer, notebook: Path) -> list[str]:
    """Clear every output, Run All, then what nbval would report on the saved run (errors
    shown on the page fail at once)."""
    click_menu(page, "Edit", "Clear Outputs of All Cells")
    page.wait_for_function(OUTPUTS_CLEARED_JS)
    click_menu(page, "Run", "Run All Cells")
    page.wait_for_function(RUN_ALL_DONE_JS, timeout=RUN_ALL_TIMEOUT_S * 1000, polling=500)
    assert_no_error_outputs(page, "after Run All Cells")
    return saved_run_problems(notebook, save_and_read(page, lab, notebook))


def save_and_read(page, lab: LabServer, notebook: Path) -> dict:
    """Save the notebook as a reader does (Ctrl+S) and read back what JupyterLab wrote."""
    path = f"/api/contents/{urllib.parse.quote(notebook.name)}"
    before = lab.api(path + "?content=0")["last_modified"]
    page.locator(".jp-NotebookPanel .jp-Cell").first.click()
    page.keyboard.press("Escape")  # command mode: the shortcut saves the notebook
    page.keyboard.press("ControlOrMeta+S")
    deadline = time.monotonic() + PANEL_TIMEOUT_S
    while lab.api(path + "?content=0")["last_modified"] == before:
        assert time.monotonic() < deadline, "JupyterLab did not save the notebook"
        page.wait_for_timeout(250)
    while True:  # the server may still be writing: it answers 400 "Unreadable Notebook" meanwhile
        try:
            return lab.api(path + "?content=1")["content"]
        except urllib.error.HTTPError as error:
            if error.code != 400 or time.monotonic() > deadline:
                raise
            page.wait_for_timeout(250)


def next_value(readout_text: str, minimum: float, maximum: float) -> str:
    """A value one notch from the current one, inside the slider's range, as a reader types it."""
    current = float(readout_text)
    if "." not in readout_text:
        step = 1.0
        decimals = 0
    else:
        decimals = len(readout_text.split(".")[1])
        step = max((maximum - minimum) / 10, 10**-decimals)
    value = current + step if current + step <= maximum else current - step
    return f"{value:.{decimals}f}"


def readout_text(readout) -> str:
    return readout.evaluate("e => (e.tagName === 'INPUT' ? e.value : e.textContent).trim()")


def wait_for_change(page, cell_index: int, before: list[str]) -> list[str]:
    """The panel's output once it differs from `before` and the kernel is idle again."""
    deadline = time.monotonic() + PANEL_TIMEOUT_S
    after = page.evaluate(PANEL_OUTPUT_JS, cell_index)
    while after == before and time.monotonic() < deadline:
        page.wait_for_timeout(250)
        after = page.evaluate(PANEL_OUTPUT_JS, cell_index)
    page.wait_for_function(KERNEL_IDLE_JS, timeout=PANEL_TIMEOUT_S * 1000)
    page.wait_for_timeout(500)  # outputs that arrive with the last idle message
    return page.evaluate(PANEL_OUTPUT_JS, cell_index)


def exercise_panel(page, cell_index: int) -> str:
    """Type a new value into the panel's first slider, press Enter, click Run; assert it reacts."""
    started = time.monotonic()
    cell = page.locator(".jp-Notebook .jp-Cell").nth(cell_index)
    cell.evaluate("cell => cell.scrollIntoView({block: 'start'})")
    slider = cell.locator(".widget-slider").filter(has=page.locator(READOUT)).first
    readout = slider.locator(READOUT)
    handle = slider.locator("[role='slider']")  # ipywidgets 8 (noUiSlider) states its range
    has_range = handle.count() > 0
    minimum = float(handle.get_attribute("aria-valuemin")) if has_range else float("-inf")
    maximum = float(handle.get_attribute("aria-valuemax")) if has_range else float("inf")
    old_text = readout_text(readout)
    new_text = next_value(old_text, minimum, maximum)
    before = page.evaluate(PANEL_OUTPUT_JS, cell_index)
    readout.click()
    page.keyboard.press("ControlOrMeta+A")
    page.keyboard.type(new_text)
    page.keyboard.press("Enter")
    page.wait_for_timeout(300)
    shown = readout_text(readout)
    assert float(shown) == pytest.approx(float(new_text)), (
        f"slider readout shows {shown!r} after typing {new_text!r}"
    )
    run_button = cell.locator(".widget-button").filter(has_text=re.compile(r"\brun\b", re.I))
    clicked = run_button.count() > 0
    if clicked:
        run_button.first.click()
    after = wait_for_change(page, cell_index, before)
    assert after != before, (
        f"cell {cell_index}: output unchanged after setting the slider {old_text} -> {new_text}"
        + (" and clicking Run" if clicked else "")
    )
    return f"{old_text} -> {new_text} ({time.monotonic() - started:.1f} s)"


def show_first_panel(page, cell_index: int) -> None:
    """Frame the screenshot on the first panel's output, with the file browser folded away."""
    page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current").click()
    output = page.locator(".jp-Notebook .jp-Cell").nth(cell_index).locator(".jp-Cell-outputArea")
    output.evaluate("area => area.scrollIntoView({block: 'start'})")
    page.wait_for_function(IMAGES_PAINTED_JS, arg=cell_index)  # a decoding figure shows blank
    page.wait_for_timeout(2000)  # and the replaced output has finished its layout


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_runs_and_its_widgets_respond(chromium_browser, lab, notebook: Path) -> None:
    started = time.monotonic()
    page = chromium_browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(60_000)
    screenshot = SCREENSHOTS / f"{notebook.stem}.png"
    try:
        # ?reset: a fresh workspace, so the previous notebook's tab is not restored beside this one
        url = f"{lab.base_url}/lab/tree/{urllib.parse.quote(notebook.name)}?reset&token={lab.token}"
        page.goto(url)
        page.wait_for_selector(".jp-NotebookPanel .jp-Cell")
        page.wait_for_function(KERNEL_IDLE_JS)
        if committed_widget_models(notebook):  # first open, before anything runs
            page.locator(".widget-slider").first.wait_for(
                state="visible", timeout=PANEL_TIMEOUT_S * 1000
            )  # a loaded machine renders the saved widgets slowly
            shown_as_text = page.evaluate(WIDGET_REPR_JS)
            assert not shown_as_text, f"saved panels shown as text on open: {shown_as_text[:2]}"
        problems = run_all_and_check(page, lab, notebook)
        run_all_s = time.monotonic() - started
        if problems and all(problem.endswith("did not run") for problem in problems):
            # JupyterLab now and then runs none of a few collapsed cells on Run All, the rest all
            # run (a fresh-clone run: 07's three hidden solutions, 18 s of work, never started):
            # once more, and only for that
            print(f"{notebook.name}: Run All left {', '.join(problems)}; running all again")
            problems = run_all_and_check(page, lab, notebook)
        assert not problems, "\n".join(problems)

        assert page.locator(".widget-slider").count(), "no ipywidgets slider rendered"
        page.locator(".widget-slider").first.wait_for(state="visible")
        if "ButtonModel" in committed_widget_models(notebook):
            assert page.locator(".widget-button").count(), "the notebook's Button did not render"

        panels = page.evaluate(PANEL_CELLS_JS)
        assert panels, "no slider with an editable readout rendered"
        moves = [exercise_panel(page, index) for index in panels]
        assert_no_error_outputs(page, "after moving the sliders")
        show_first_panel(page, panels[0])
    finally:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=screenshot)
        page.close()
        lab.shutdown_kernels()
    print(
        f"{notebook.name}: {time.monotonic() - started:.1f} s in all, Run All {run_all_s:.1f} s;"
        f" sliders moved: {', '.join(moves)}; screenshot {screenshot}"
    )
