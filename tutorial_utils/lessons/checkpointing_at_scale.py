"""Notebook 05's rank files: shown, run under torchrun with readable errors, and drawn per rank.

The rank files live in ``examples/`` (a notebook cannot be a rank). The notebook shows them with
highlighting, runs them on gloo CPU ranks, and reads rank 0's report from a file: gloo prints its
own lines on the ranks' stdout in some torch versions. The panel reruns the measuring file at the
sizes a learner picks, so memory falls and time rises as width, depth and batch change.
"""

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
    "all_gathers",
    "ScalePanel",
    "ScaleRun",
    "example_file",
    "parse_rank_output",
    "plot_scale_run",
    "rank_report",
    "run_rank_file",
    "run_ranks",
    "show_example",
]

EXAMPLES_URL = (
    "https://raw.githubusercontent.com/checkpointing-tutorial/checkpointing-tutorial/main/examples/"
)
SETUPS = ("DDP", "DDP + checkpointing", "FSDP", "FSDP + checkpointing")
PLAINS = ("DDP", "FSDP")
RANKS = 2
TURNS = 2
RANK_COLORS = ("#4c72b0", "#dd8452")
TICK_NAMES = {
    "DDP": "DDP",
    "DDP + checkpointing": "DDP\n+ ckpt",
    "FSDP": "FSDP",
    "FSDP + checkpointing": "FSDP\n+ ckpt",
}

MEMORY_LINE = re.compile(
    r"^\s*rank (\d+)\s+(.+?)\s+([\d.]+) \|\s+([\d.]+) \|\s+([\d.]+)\s*$", re.MULTILINE
)
TIME_BLOCK = re.compile(
    r"^rank (\d+), (\w+):\n\s*cpu time\s+plain\s.*\n\s*cpu time\s+checkpointed\s.*"
    r"x([\d.]+), beyond noise: (True|False)",
    re.MULTILINE,
)


@dataclass(frozen=True)
class ScaleRun:
    """What rank 0 printed, per rank: memory by setup (MiB) and checkpointing's CPU-time ratio."""

    kept_mib: dict[tuple[int, str], float]  # (rank, setup): parameters + Adam between steps
    peak_mib: dict[tuple[int, str], float]  # (rank, setup): forward + backward peak
    cpu_ratio: dict[tuple[int, str], tuple[float, bool]]  # (rank, DDP|FSDP): (x, beyond noise)
    header: str
    memory_report: str
    time_report: str

    @property
    def ranks(self) -> list[int]:
        return sorted({rank for rank, _ in self.peak_mib})


def parse_rank_output(stdout: str) -> ScaleRun:
    """Rank 0's report (header, DDP cases, memory table, step times) as numbers per rank."""
    sections = stdout.strip().split("\n\n")
    if len(sections) not in (4, 5):
        raise ValueError(f"expected 4 or 5 sections in the rank file's report, got {len(sections)}")
    header, _, memory_report, time_report = sections[:4]
    kept, peak = {}, {}
    for rank, name, kept_text, peak_text, _ in MEMORY_LINE.findall(memory_report):
        if name not in SETUPS:
            raise ValueError(f"unknown setup {name!r} in the memory table")
        kept[int(rank), name] = float(kept_text)
        peak[int(rank), name] = float(peak_text)
    ratios = {
        (int(rank), plain): (float(ratio), beyond == "True")
        for rank, plain, ratio, beyond in TIME_BLOCK.findall(time_report)
    }
    ranks = {rank for rank, _ in peak}
    if (
        not ranks
        or len(peak) != len(SETUPS) * len(ranks)
        or len(ratios) != len(PLAINS) * len(ranks)
    ):
        raise ValueError("the rank file's memory table or step times are incomplete")
    return ScaleRun(kept, peak, ratios, header, memory_report, time_report)


COLLECTIVES_LINE = re.compile(
    r"^\s*rank (\d+)\s+(.+?)\s+(\d+) all-gathers \|\s+(\d+) reduce-scatters", re.MULTILINE
)


def all_gathers(report: str) -> dict[tuple[int, str], int]:
    """(rank, order of wrapping): the all-gathers of one step, from the report's last section."""
    found = {(int(r), order): int(n) for r, order, n, _ in COLLECTIVES_LINE.findall(report)}
    if not found:
        raise ValueError("the rank file's report holds no all-gather counts")
    return found


def example_file(name: str) -> Path:
    """``examples/<name>`` of the repository: beside the package in a checkout, or beside the
    notebooks' folder where the package is installed from a wheel; failing both (Colab), a copy
    downloaded from the repository into a temporary folder."""
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


RANK_LINE = re.compile(r"^\[rank(\d+)\]: ?(.*)$")  # torchrun prefixes each rank's stderr
KNOCK_ON = ("Connection closed by peer", "Connection reset by peer")  # a rank that saw another fail


def first_traceback(stderr: str) -> str:
    """The error of the rank that failed first, with the few lines above it, from torchrun's
    stderr; the ranks that only lost their peer come second."""
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
    rest = [line for line in stderr.splitlines() if line.strip()]
    return rest[-1].strip() if rest else "no message"


def run_ranks(
    rank_file: Path | str, options: list[str] | None = None, ranks: int = 2, gpus: bool = False
) -> str:
    """Run ``rank_file`` under torchrun on ``ranks`` processes, one thread each; its stdout.

    The ranks import ``tutorial_utils.tools`` from where this process found it. ``gpus=False``
    hides the GPUs, so the ranks talk gloo on the CPU. A failure raises ``RankError`` with the
    first rank's traceback and the command to rerun in a terminal.
    """
    import tutorial_utils.tools

    tools_root = str(Path(tutorial_utils.tools.__file__).parents[1])
    paths = [tools_root, *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "OMP_NUM_THREADS": "1"}
    if not gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", str(ranks), str(rank_file), *(options or [])]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RankError(
            f"torchrun exited with {done.returncode}; the first rank's error:\n"
            f"{first_traceback(done.stderr)}\n(rerun in a terminal to see every rank: "
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


def run_rank_file(rank_file: Path, width: int, depth: int, batch: int) -> str:
    """Rank 0's report of the measuring rank file on 2 gloo CPU ranks, one thread each."""
    options = f"--width {width} --depth {depth} --batch {batch} --turns {TURNS}".split()
    return rank_report(rank_file, options, RANKS)


def plot_scale_run(run: ScaleRun, width: int, depth: int, batch: int) -> Figure:
    """Per rank: the forward + backward peak of each setup, and checkpointing's CPU-time ratio."""
    fig, (memory_ax, time_ax) = plt.subplots(
        1, 2, figsize=(9.5, 3.8), gridspec_kw={"width_ratios": (2, 1)}
    )
    plt.close(fig)
    ranks = run.ranks
    bar = 0.8 / len(ranks)
    for index, rank in enumerate(ranks):
        offset = (index - (len(ranks) - 1) / 2) * bar
        memory_ax.bar(
            [i + offset for i in range(len(SETUPS))],
            [run.peak_mib[rank, name] for name in SETUPS],
            bar,
            color=RANK_COLORS[index % len(RANK_COLORS)],
            label=f"rank {rank}",
        )
        time_ax.bar(
            [i + offset for i in range(len(PLAINS))],
            [run.cpu_ratio[rank, plain][0] for plain in PLAINS],
            bar,
            color=RANK_COLORS[index % len(RANK_COLORS)],
            label=f"rank {rank}",
        )
    memory_ax.set_xticks(range(len(SETUPS)), [TICK_NAMES[name] for name in SETUPS])
    memory_ax.set_ylabel("forward + backward peak (MiB)")
    memory_ax.set_ylim(0, 1.15 * max(run.peak_mib.values()))
    memory_ax.grid(axis="y", alpha=0.3)
    time_ax.axhline(1.0, color="black", linewidth=1)
    time_ax.set_xticks(range(len(PLAINS)), list(PLAINS))
    time_ax.set_ylabel("CPU time, checkpointed / plain")
    time_ax.set_ylim(0, 1.15 * max(1.0, *(x for x, _ in run.cpu_ratio.values())))
    time_ax.grid(axis="y", alpha=0.3)
    time_ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.suptitle(
        f"{depth} blocks of width {width}, global batch {batch}: measured on this machine "
        f"({RANKS} gloo ranks)\n{figure_subtitle('cpu')}",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


class ScalePanel:
    """Width, depth and global batch; Run launches the rank file under torchrun and draws it."""

    def __init__(self, rank_file: Path | str, width: int = 128, depth: int = 8, batch: int = 512):
        self.rank_file = Path(rank_file)
        if not self.rank_file.is_file():
            raise FileNotFoundError(f"no rank file at {self.rank_file}: run the core cells first")
        controls = {
            "width": int_slider("model width", width, 16, 512),
            "depth": int_slider("depth (blocks)", depth, 1, 16),
            "batch": int_slider("global batch (split over 2 ranks)", batch, 2, 4096),
        }
        self.panel = RunPanel(
            controls, self.compute, title="DDP and FSDP, with and without checkpointing, per rank"
        )
        self.widget = self.panel.widget

    def compute(self, width: int, depth: int, batch: int) -> tuple[Figure, str]:
        run = parse_rank_output(run_rank_file(self.rank_file, width, depth, batch))
        text = f"{run.header}\n\n{run.memory_report}\n\n{run.time_report}"
        return plot_scale_run(run, width, depth, batch), text
