"""Shared pytest configuration and fixtures."""

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Notebooks are collected by nbval from notebooks/ only; an .ipynb kept under tests/ is data.
collect_ignore_glob = ["*.ipynb"]


def pytest_collection_modifyitems(items: list) -> None:
    """The browser test first: it is the suite's longest single run (every notebook, one after
    the other, on one pytest-xdist worker), so starting it first lets the other worker take the
    unit tests beside it instead of after it (``./scripts/test`` keeps this order with
    ``--no-loadscope-reorder``)."""
    items.sort(key=lambda item: item.get_closest_marker("browser") is None)


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
