"""Notebook 05's rank files (in ``examples/``: a notebook cannot be a rank): shown, run under
torchrun with readable errors, read from rank 0's report file (gloo prints on stdout in some torch
versions), and rerun by a panel at the sizes a learner picks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from tutorial_utils.display.plotting import figure_subtitle
from tutorial_utils.display.widgets import RunPanel, int_slider

__all__ = [
    "RankError",
    "ScaleRun",
    "all_gathers",
    "example_file",
    "parse_rank_output",
    "plot_scale_run",
    "rank_report",
    "run_ranks",
    "scale_panel",
    "show_example",
]

EXAMPLES_URL = (
    "https://raw.githubusercontent.com/checkpointing-tutorial/checkpointing-tutorial/main/examples/"
)
SETUPS = ("DDP", "DDP + checkpointing", "FSDP", "FSDP + checkpointing")
PLAINS = ("DDP", "FSDP")
MEMORY_LINE = re.compile(
    r"^\s*rank (\d+)\s+(.+?)\s+([\d.]+) \|\s+([\d.]+) \|\s+([\d.]+)\s*$", re.MULTILINE
)
TIME_BLOCK = re.compile(
    r"^rank (\d+), (\w+):\n\s*cpu time\s+plain\s.*\n\s*cpu time\s+checkpointed\s.*"
    r"x([\d.]+), beyond noise: (True|False)",
    re.MULTILINE,
)
COLLECTIVES_LINE = re.compile(
    r"^\s*rank (\d+)\s+(.+?)\s+(\d+) all-gathers \|\s+(\d+) reduce-scatters", re.MULTILINE
)
RANK_LINE = re.compile(r"^\[rank(\d+)\]: ?(.*)$")  # torchrun prefixes each rank's stderr
KNOCK_ON = ("Connection closed by peer", "Connection reset by peer")  # a rank that saw another fail
RANK_TRACEBACK = re.compile(r"^\[rank\d+\]: ?Traceback", re.MULTILINE)
SUMMARY_LINE = re.compile(r"^\s*(rank|exitcode|traceback)\s*:")  # torchrun's failure summary


@dataclass(frozen=True)
class ScaleRun:
    """What rank 0 printed, per rank: memory by setup (MiB) and checkpointing's CPU-time ratio."""

    kept_mib: dict[tuple[int, str], float]  # (rank, setup): parameters + Adam between steps
    peak_mib: dict[tuple[int, str], float]  # (rank, setup): forward + backward peak
    cpu_ratio: dict[tuple[int, str], tuple[float, bool]]  # (rank, DDP|FSDP): (x, beyond noise)
    text: str  # the header, the memory table and the step times, as printed


def parse_rank_output(report: str) -> ScaleRun:
    """Rank 0's report (header, DDP cases, memory table, step times) as numbers per rank."""
    sections = report.strip().split("\n\n")
    if len(sections) not in (4, 5):
        raise ValueError(f"expected 4 or 5 sections in the rank file's report, got {len(sections)}")
    kept, peak = {}, {}
    for rank, name, kept_text, peak_text, _ in MEMORY_LINE.findall(sections[2]):
        if name not in SETUPS:
            raise ValueError(f"unknown setup {name!r} in the memory table")
        kept[int(rank), name], peak[int(rank), name] = float(kept_text), float(peak_text)
    ratios = {
        (int(rank), plain): (float(ratio), beyond == "True")
        for rank, plain, ratio, beyond in TIME_BLOCK.findall(sections[3])
    }
    ranks = {rank for rank, _ in peak}
    if not ranks or len(peak) != 4 * len(ranks) or len(ratios) != 2 * len(ranks):
        raise ValueError("the rank file's memory table or step times are incomplete")
    return ScaleRun(kept, peak, ratios, "\n\n".join([sections[0], *sections[2:4]]))


def all_gathers(report: str) -> dict[tuple[int, str], int]:
    """(rank, order of wrapping): the all-gathers of one step, from the report's last section."""
    found = {(int(r), order): int(n) for r, order, n, _ in COLLECTIVES_LINE.findall(report)}
    if not found:
        raise ValueError("the rank file's report holds no all-gather counts")
    return found


def example_file(name: str) -> Path:
    """``examples/<name>``: beside the package in a checkout, or beside the notebooks' folder;
    failing both (Colab), a copy downloaded from the repository into a temporary folder."""
    for root in (Path(__file__).resolve().parents[2], Path.cwd().parent, Path.cwd()):
        if (root / "examples" / name).is_file():
            return root / "examples" / name
    copy = Path(tempfile.mkdtemp()) / name
    try:
        urllib.request.urlretrieve(EXAMPLES_URL + name, copy)
    except OSError as error:
        raise FileNotFoundError(
            f"no examples/{name} here and it could not be downloaded ({error}): clone the repository"
        ) from error
    return copy


def show_example(name: str) -> object:
    """The rank file as highlighted Python, for a notebook cell's output."""
    from IPython.display import Code

    return Code(filename=str(example_file(name)), language="python")


class RankError(RuntimeError):
    """A rank file failed under torchrun: the failing rank's error, not the launcher's noise."""


def _first_traceback(stderr: str) -> str:
    """The last lines of the traceback of the rank that failed first, from torchrun's stderr;
    the ranks that only lost their peer come second."""
    by_rank: dict[int, list[str]] = {}
    for line in stderr.splitlines():
        if found := RANK_LINE.match(line):
            by_rank.setdefault(int(found[1]), []).append(found[2])
    blocks = []
    for rank, lines in by_rank.items():
        starts = [i for i, line in enumerate(lines) if line.startswith("Traceback")]
        if starts:
            blocks.append((rank, lines[starts[-1] :]))
    blocks.sort(key=lambda block: any(text in block[1][-1] for text in KNOCK_ON))
    if blocks:
        rank, lines = blocks[0]
        return f"rank {rank}:\n" + "\n".join(lines[-5:])
    summary = [line.strip() for line in stderr.splitlines() if SUMMARY_LINE.match(line)]
    if summary:  # no rank raised: torchrun's own account (a signal, an exit code)
        return "\n".join(summary[:4])
    rest = [line for line in stderr.splitlines() if line.strip() and not line.startswith("==")]
    return rest[-1].strip() if rest else "no message"


def run_ranks(
    rank_file: Path | str, options: list[str] | None = None, ranks: int = 2, gpus: bool = False
) -> str:
    """Run ``rank_file`` under torchrun on ``ranks`` processes, one thread each; its stdout. The
    ranks import ``tutorial_utils.tools`` from here; ``gpus=False`` hides the GPUs (gloo on CPU).
    A run that fails with no rank's traceback is run once more before it counts as failed."""
    import tutorial_utils.tools

    tools_root = str(Path(tutorial_utils.tools.__file__).parents[1])
    paths = [tools_root, *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "OMP_NUM_THREADS": "1"}
    if not gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", str(ranks), str(rank_file), *(options or [])]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0 and not RANK_TRACEBACK.search(done.stderr):
        # no rank raised (a rank killed by a signal, the launcher's own failure): once more,
        # as one would by hand; gloo has crashed a CPU rank at exit, now and then, on 2 cores
        done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RankError(
            f"torchrun exited with {done.returncode}; the first rank's error:\n"
            f"{_first_traceback(done.stderr)}\n(rerun in a terminal to see every rank: "
            f"torchrun {' '.join(command[3:])})"
        )
    return done.stdout


def rank_report(
    rank_file: Path | str, options: list[str] | None = None, ranks: int = 2, gpus: bool = False
) -> str:
    """What rank 0 wrote to ``--report``: a file, apart from anything gloo prints."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.txt"
        run_ranks(rank_file, [*(options or []), "--report", str(report)], ranks, gpus)
        return report.read_text(encoding="utf-8")


def plot_scale_run(run: ScaleRun, title: str) -> Figure:
    """Per rank: the forward + backward peak of each setup, and checkpointing's CPU-time ratio."""
    fig, (memory_ax, time_ax) = plt.subplots(
        1, 2, figsize=(9.5, 3.8), gridspec_kw={"width_ratios": (2, 1)}
    )
    plt.close(fig)
    ranks = sorted({rank for rank, _ in run.peak_mib})
    width = 0.8 / len(ranks)
    for index, rank in enumerate(ranks):
        offset, style = (index - (len(ranks) - 1) / 2) * width, {"color": f"C{index}"}
        peaks = [run.peak_mib[rank, name] for name in SETUPS]
        memory_ax.bar([i + offset for i in range(4)], peaks, width, label=f"rank {rank}", **style)
        ratios = [run.cpu_ratio[rank, plain][0] for plain in PLAINS]
        time_ax.bar([i + offset for i in range(2)], ratios, width, label=f"rank {rank}", **style)
    ticks = [name.replace(" + checkpointing", "\n+ ckpt") for name in SETUPS]
    memory_ax.set_xticks(range(4), ticks)
    memory_ax.set_ylabel("forward + backward peak (MiB)")
    memory_ax.set_ylim(0, 1.15 * max(run.peak_mib.values()))
    time_ax.axhline(1.0, color="black", linewidth=1)
    time_ax.set_xticks(range(2), list(PLAINS))
    time_ax.set_ylabel("CPU time, checkpointed / plain")
    time_ax.set_ylim(0, 1.15 * max(1.0, *(x for x, _ in run.cpu_ratio.values())))
    time_ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    for axis in (memory_ax, time_ax):
        axis.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{title}: measured on this machine\n{figure_subtitle('cpu')}", fontsize=9)
    fig.tight_layout()
    return fig


def scale_panel(
    rank_file: Path | str, width: int = 128, depth: int = 8, batch: int = 512, turns: int = 2
) -> RunPanel:
    """Width, depth and global batch; Run launches the rank file on 2 gloo CPU ranks and draws it."""
    if not Path(rank_file).is_file():
        raise FileNotFoundError(f"no rank file at {rank_file}: run the core cells first")

    def compute(width: int, depth: int, batch: int) -> tuple[Figure, str]:
        options = f"--width {width} --depth {depth} --batch {batch} --turns {turns}".split()
        run = parse_rank_output(rank_report(rank_file, options))
        title = f"{depth} blocks of width {width}, global batch {batch} (2 gloo ranks)"
        return plot_scale_run(run, title), run.text

    controls = {
        "width": int_slider("model width", width, 16, 512),
        "depth": int_slider("depth (blocks)", depth, 1, 16),
        "batch": int_slider("global batch (split over 2 ranks)", batch, 2, 4096),
    }
    return RunPanel(
        controls, compute, title="DDP and FSDP, with and without checkpointing, per rank"
    )
