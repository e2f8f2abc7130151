"""The GPU table (``tutorial_utils.gpus``): a card is one row, and every list of cards follows it;
the rules that pick by compute capability are chosen by torch version, and the kernel choice reads
them from the table."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

import pytest
import torch

from tutorial_utils import gpus
from tutorial_utils.__main__ import build_parser
from tutorial_utils.estimate.card import parse_card
from tutorial_utils.gpus import (
    GPUS,
    GpuModel,
    cards_markdown,
    cublas_rule,
    cublas_workspace_bytes,
    cublas_workspace_per_call,
    gpu_choices,
    gpu_help,
    sdpa_rule_set,
)
from tutorial_utils.measurement.gpu_attention import AttentionCall, SdpaRules, choose_kernel
from tutorial_utils.units import GiB, MiB

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import write_pages  # noqa: E402


@pytest.fixture
def new_card(monkeypatch: pytest.MonkeyPatch) -> str:
    """A made-up card, added as one row of the table."""
    row = GpuModel("Test GPU 7", sm=(9, 0), memory_bytes=96 * GiB, bf16_flops=1e15, bandwidth=5e12)
    monkeypatch.setitem(GPUS, "test-gpu-7", row)
    return "test-gpu-7"


def gpu_option(parser: argparse.ArgumentParser) -> argparse.Action:
    """``estimate --gpu`` as the command line builds it."""
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return next(a for a in commands.choices["estimate"]._actions if a.dest == "gpu")


def test_a_new_card_row_reaches_the_choices_the_help_and_the_readme_list(new_card):
    option = gpu_option(build_parser())
    assert option.choices is not None and new_card in option.choices
    assert new_card in gpu_choices() and new_card in gpu_help()
    assert option.help is not None and f"{new_card} (sm90, 96 GiB)" in option.help
    assert f"| `{new_card}` | Test GPU 7 | 9.0, Hopper | 96.0 | 1,000 | 5,000 |" in cards_markdown()
    card = parse_card(None, gpu=new_card)  # its memory, its generation's context, its workspace
    assert card.total_bytes == 96 * GiB and card.workspace_bytes == cublas_workspace_bytes((9, 0))


def test_the_readme_lists_the_cards_of_the_table():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert write_pages.replace_between(readme, "cards", cards_markdown(), "README.md") == readme
    section = readme.split("<!-- pages:cards:begin -->")[1].split("<!-- pages:cards:end -->")[0]
    listed = re.findall(r"^\| `([\w-]+)` \|", section, re.M)
    assert listed[1:] == [key for key, model in GPUS.items() if model.sm is not None]  # [0]: header


def test_a_card_without_a_generation_row_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(GPUS, "future", GpuModel("Future", sm=(13, 0)))
    with pytest.raises(ValueError, match="compute capability 13.0 has no row"):
        parse_card(None, gpu="future").context_bytes  # noqa: B018


def test_every_card_has_sourced_facts_and_a_generation():
    for key, model in GPUS.items():
        if model.sm is None:
            continue
        assert model.memory_bytes and model.bandwidth and model.fp32_flops, key
        assert model.peaks_source and model.generation is not None, key
        assert model.context_source, key


@pytest.mark.parametrize(
    ("version", "first", "read_for_it"),
    [("2.15.0", "2.14", True), ("2.14.1+cu130", "2.14", True), ("2.9.1", "2.14", False)],
)
def test_the_sdpa_rules_are_chosen_by_torch_version(version, first, read_for_it):
    table, exact = sdpa_rule_set(version)
    assert table.torch_versions[0] == first and exact is read_for_it


@pytest.mark.parametrize(
    ("version", "hopper_bytes", "ampere_bytes"),
    [
        ("2.14.1", 32 * MiB, 8 * MiB + 128 * 1024),  # CUBLAS_WORKSPACE_CONFIG's default, sm90 32
        ("2.15.0", 32 * MiB, 8 * MiB + 128 * 1024),  # per call; 32 MiB on majors 9 to 12
    ],
)
def test_the_cublas_workspace_follows_the_torch_version(version, hopper_bytes, ampere_bytes):
    assert cublas_workspace_bytes((9, 0), version) == hopper_bytes
    assert cublas_workspace_bytes((8, 0), version) == ampere_bytes
    assert cublas_rule(version)[1]
    blackwell = cublas_workspace_bytes((12, 0), version)  # an RTX 5090
    assert blackwell == (32 * MiB if version.startswith("2.15") else ampere_bytes)
    assert cublas_workspace_per_call(version) == version.startswith("2.15")


def test_the_installed_torch_has_a_rule_set_read_for_it():
    installed = torch.__version__
    assert sdpa_rule_set(installed)[1] and cublas_rule(installed)[1], (
        f"torch {installed} is outside every rule set of tutorial_utils/gpus.py: read its "
        "sdp_utils.cpp and CublasHandlePool.cpp and add a row"
    )


def test_the_kernel_choice_reads_its_ranges_from_the_table():
    call = AttentionCall(torch.bfloat16, 128, 128, 512, 512, 1, 8)
    ampere = SdpaRules((8, 0), 92600)
    assert choose_kernel(ampere, call) == "flash"
    no_flash = dataclasses.replace(ampere.table, flash=((9, 0), (12, 1)))  # a made-up torch
    assert choose_kernel(dataclasses.replace(ampere, table=no_flash), call) == "efficient"
    no_sm80 = dataclasses.replace(no_flash, efficient=((9, 0), (12, 1)))
    # then the math path: it comes before cuDNN in the default order on sm80
    assert choose_kernel(dataclasses.replace(ampere, table=no_sm80), call) == "math"


def test_the_table_ranges_match_the_installed_torchs_compiled_checks():
    """The CUDA build of torch carries sdp_utils.cpp's warnings, ranges included."""
    library = Path(torch.__file__).parent / "lib" / "libtorch_cuda.so"
    if not library.exists():
        pytest.skip("a torch without CUDA kernels: no compiled checks to read")
    table, _ = sdpa_rule_set(torch.__version__)
    text = library.read_bytes()

    def sm(bounds) -> bytes:
        (a, b), (c, d) = bounds
        return f"[sm{a}{b}, sm{c}{d}]".encode()

    assert (
        b"Flash attention only supports gpu architectures in the range " + sm(table.flash) in text
    )
    assert b"Attention only supports gpu architectures in the range " + sm(table.efficient) in text
    assert b"cuDNN MHA only supports gpu architectures in the range " + sm(table.cudnn) in text
    assert b"on SM86-SM89 or SM120-SM121" in text  # flash's backward head-size limit


def test_the_module_needs_no_torch():
    source = Path(gpus.__file__).read_text(encoding="utf-8")
    assert "import torch" not in source
