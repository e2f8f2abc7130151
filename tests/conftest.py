"""Shared pytest configuration and fixtures."""

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import beside
from tests.schedule import notebook_first_scheduler, schedule

# Notebooks are collected by nbval from notebooks/ only; an .ipynb kept under tests/ is data.
collect_ignore_glob = ["*.ipynb"]


BESIDE = pytest.StashKey[list]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        beside.OPTION,
        action="append",
        default=[],
        metavar="COMMAND",
        help="a check to run beside the tests at the lowest CPU priority (./scripts/test: mypy); "
        "its output is printed at the end and its failure fails the run (tests/beside.py)",
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    """Start the ``--beside`` checks once, in the process that reports (not in xdist's workers)."""
    config = session.config
    if not hasattr(config, "workerinput"):
        config.stash[BESIDE] = beside.start_all(config.getoption(beside.OPTION))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A failed ``--beside`` check fails the run; an interrupted run stops them."""
    checks = session.config.stash.get(BESIDE, [])
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        for check in checks:
            check.stop()
    elif beside.failed(checks) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    checks = config.stash.get(BESIDE, [])
    if checks and exitstatus != pytest.ExitCode.INTERRUPTED:
        terminalreporter.section("checks beside the tests")
        for line in beside.summary_lines(checks):
            terminalreporter.line(line)


def pytest_collection_modifyitems(items: list) -> None:
    """The notebook runs first, longest recorded run first (tests/schedule.py)."""
    schedule(items)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # optional: pytest-xdist may be absent
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Under ``--dist loadscope``: each notebook run is a unit of work of its own, so that the
    notebooks spread over both workers and the unit tests fill the gaps (tests/schedule.py)."""
    if config.getvalue("dist") != "loadscope":
        return None
    return notebook_first_scheduler(config, log, Path(__file__).resolve().parent.parent)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny real steps on one torch thread, so that they don't spin on a shared machine (a
    module opts in with ``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# transformers configs at a CPU's size, by family: what a user's downloaded config.json holds
TINY = {
    "llama": {"model_type": "llama"},
    "qwen2": {"model_type": "qwen2"},
    "mistral": {"model_type": "mistral", "sliding_window": 32},  # shorter than the sequence
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128},
}
DECODER_SIZES = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


@pytest.fixture
def tiny_config(tmp_path: Path) -> Callable[..., str]:
    """Writes a family's config.json at a CPU's size (``fields`` override it); returns its path."""

    def write(family: str, **fields: object) -> str:
        config = {**TINY[family], "vocab_size": 500, "bos_token_id": 0, "eos_token_id": 0}
        if family != "gpt2":
            config.update(DECODER_SIZES)
        config.update(fields)
        path = tmp_path / f"{family}.json"
        path.write_text(json.dumps(config))
        return str(path)

    return write
