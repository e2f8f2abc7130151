"""The estimator against real CPU steps, the presets against their published sizes, and the
``estimate`` command's answers to good and bad input.

Real and dry-run steps are compared to the byte. Two differences are expected and asserted
exactly where they occur:

* AdamW keeps one float32 step counter per trained tensor on the CPU. A CPU step counts them
  (they are on its device); a dry run does not, as a CUDA step does not (they stay on the CPU
  there too): real - dry = 4 bytes x trained tensors. SGD has none: equal.
* ``native_layer_norm`` on a CPU returns its saved mean and rstd in the input's dtype; the meta
  kernel returns float32, as CUDA does. So GPT-2 (LayerNorm) is compared in fp32 and under
  autocast, where LayerNorm's input is float32; pure bf16 is compared on RMSNorm models.
"""

from __future__ import annotations

import json

import pytest
import torch

from tutorial_utils.__main__ import main
from tutorial_utils.checkpointing.strategy import Strategy
from tutorial_utils.estimate.card import Card, parse_bytes, parse_card
from tutorial_utils.estimate.estimator import (
    Workload,
    build_model,
    cuda_autocast_precision,
    estimate,
    largest_fit,
    train_step,
)
from tutorial_utils.estimate.gpu_step import as_gpu_runs
from tutorial_utils.estimate.models import PRESETS, preset_config, repeated_blocks
from tutorial_utils.estimate.report import estimate_table
from tutorial_utils.estimate.strategies import parse_strategy
from tutorial_utils.gpus import cublas_workspace_bytes, cublas_workspace_per_call
from tutorial_utils.units import GiB, MiB

ADAM_STEP_BYTES = 4
pytestmark = pytest.mark.usefixtures("one_thread")


def real_and_dry(workload: Workload, strategy: Strategy):
    """The same step on the CPU (real weights, LoRA's B drawn as if trained) and on meta."""
    real = build_model(workload, device="cpu")
    with torch.no_grad():
        for name, parameter in real.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.02)
    dry = build_model(workload)
    return train_step(real, workload, strategy), train_step(dry, workload, strategy), real


def expected_gap(workload: Workload, model) -> int:
    if workload.optimizer == "sgd":
        return 0
    return ADAM_STEP_BYTES * sum(1 for p in model.parameters() if p.requires_grad)


LM_CASES = [
    ("llama", "bf16", 0, "none", "adamw"),
    ("llama", "amp-bf16", 4, "every-block", "adamw"),
    ("llama", "amp-bf16", 0, "selective", "sgd"),
    ("qwen2", "amp-bf16", 4, "selective", "adamw"),
    ("qwen2", "bf16", 0, "every-block", "sgd"),
    ("mistral", "fp32", 4, "every-block", "adamw"),
    ("mistral", "amp-bf16", 0, "none", "adamw"),
    ("gpt2", "fp32", 4, "none", "adamw"),
    ("gpt2", "amp-bf16", 0, "every-block", "sgd"),
    ("gpt2", "amp-bf16", 4, "selective", "adamw"),
]


@pytest.mark.parametrize(("family", "precision", "lora", "strategy", "optimizer"), LM_CASES)
def test_language_model_dry_run_equals_a_cpu_step(
    tiny_config, family, precision, lora, strategy, optimizer
):
    """Autocast runs the CPU's own policy in both: the real torch.autocast("cpu") and its
    emulation on meta (``measurement.autocast.CPU_POLICY``)."""
    workload = Workload(
        f"hf:{tiny_config(family)}",
        batch=2,
        size=64,
        precision=precision,
        optimizer=optimizer,
        lora_rank=lora,
        autocast_policy="cpu",
    )
    real, dry, model = real_and_dry(workload, parse_strategy(strategy))
    assert real.peak_bytes - dry.peak_bytes == expected_gap(workload, model)
    if workload.optimizer == "sgd":
        assert real.breakdown == dry.breakdown


TORCHVISION_CASES = [
    ("shufflenet_v2_x0_5", "fp32", "every-block"),
    ("shufflenet_v2_x0_5", "amp-bf16", "none"),
    ("mobilenet_v3_small", "fp32", "every-2"),
    ("mobilenet_v3_small", "amp-bf16", "selective"),
    ("resnet18", "amp-bf16", "selective"),
]


@pytest.mark.parametrize(("name", "precision", "strategy"), TORCHVISION_CASES)
def test_torchvision_dry_run_equals_a_cpu_step(name, precision, strategy):
    workload = Workload(
        f"torchvision:{name}",
        batch=2,
        size=32,
        precision=precision,
        optimizer="sgd",
        num_classes=10,
        autocast_policy="cpu",
    )
    real, dry, _ = real_and_dry(workload, parse_strategy(strategy))
    assert real.peak_bytes == dry.peak_bytes
    assert real.breakdown == dry.breakdown


def test_autocast_emulation_casts_in_the_real_order_op_by_op():
    """Autocast's C++ wrapper casts an op's arguments last first (GCC evaluates a call's
    arguments right to left), so a convolution's weight is cast before its input. Cast in the
    other order, MobileNetV3's dry run peaked 128 bytes above the real step, between two casts
    of its backward; in the real order every op's live bytes are the real step's."""
    workload = Workload(
        "torchvision:mobilenet_v3_small",
        batch=2,
        size=32,
        precision="amp-bf16",
        optimizer="sgd",
        num_classes=10,
        autocast_policy="cpu",
    )
    strategy = parse_strategy("none")
    real = train_step(build_model(workload, device="cpu"), workload, strategy, record_timeline=True)
    dry = train_step(build_model(workload), workload, strategy, record_timeline=True)
    assert real.timeline and dry.timeline
    assert allocating_events(real.timeline) == allocating_events(dry.timeline)


def allocating_events(timeline) -> list[tuple[str, int]]:
    """(op, live bytes after it) without the ops that allocate nothing and vary by release:
    ``detach`` (torch 2.9.1's meta kernels add one per saved in-place output) and the
    profiler's record-function markers."""
    return [
        (e.op, e.current_bytes)
        for e in timeline
        if e.op != "aten.detach.default" and not e.op.startswith("profiler.")
    ]


def test_checkpointing_and_autocast_change_the_peak(tiny_config):
    """The comparisons above are not of identical runs: each setting moves the figure (in a
    plain loop: in the Trainer's, two of these tiny steps peak in the optimizer step alike)."""
    peaks = {}
    for precision in ("fp32", "amp-bf16"):
        workload = Workload(
            f"hf:{tiny_config('llama')}", batch=2, size=64, precision=precision, loop="plain"
        )
        model = build_model(workload)
        for kind in ("none", "every-block"):
            peaks[precision, kind] = train_step(model, workload, parse_strategy(kind)).peak_bytes
    assert peaks["fp32", "every-block"] < peaks["fp32", "none"]
    assert len(set(peaks.values())) == len(peaks)


@pytest.mark.parametrize(
    ("preset", "published"),
    [
        # Parameter counts as the Hub's model pages publish them (safetensors metadata)
        ("llama-3.2-1b", 1.24e9),  # huggingface.co/meta-llama/Llama-3.2-1B: "1.24B params"
        ("llama-3.1-8b", 8.03e9),  # huggingface.co/meta-llama/Llama-3.1-8B: "8.03B params"
        ("qwen2.5-7b", 7.61e9),  # huggingface.co/Qwen/Qwen2.5-7B: "Number of Parameters: 7.61B"
        ("mistral-7b", 7.24e9),  # huggingface.co/mistralai/Mistral-7B-v0.1: "7.24B params"
        ("gpt2", 124e6),  # github.com/openai/gpt-2 (corrected model card): 124M
    ],
)
def test_preset_has_its_published_parameter_count(preset, published):
    from tutorial_utils.estimate.models import build_causal_lm

    model = build_causal_lm(preset_config(preset), "meta", torch.bfloat16)
    count = sum(p.numel() for p in model.parameters())
    last_digit = 0.01e9 if published >= 1e9 else 1e6  # the published figure's precision
    assert abs(count - published) < last_digit


def test_every_preset_is_tested():
    assert set(PRESETS) == {"llama-3.2-1b", "llama-3.1-8b", "qwen2.5-7b", "mistral-7b", "gpt2"}


def test_repeated_blocks_of_torchvision_models():
    with torch.device("meta"):
        import torchvision

        resnet = torchvision.models.resnet18()
    blocks = repeated_blocks(resnet)
    assert [type(b).__name__ for b in blocks] == ["BasicBlock"] * 8


def test_largest_fit_is_the_edge_of_the_budget(tiny_config):
    """The answer fits and one more unit does not: both checked by their own dry runs."""
    workload = Workload(f"hf:{tiny_config('llama')}", batch=1, size=256, precision="bf16")
    model = build_model(workload)
    strategy = parse_strategy("every-block")
    budget = train_step(model, workload.with_size(size=1024), strategy).peak_bytes + 1000
    best, trials = largest_fit(model, workload, strategy, budget, max_size=4096)
    assert best >= 1024 and trials >= 3
    assert train_step(model, workload.with_size(size=best), strategy).peak_bytes <= budget
    assert train_step(model, workload.with_size(size=best + 256), strategy).peak_bytes > budget


def test_estimate_table_says_what_ran(tiny_config):
    workload = Workload(f"hf:{tiny_config('gpt2')}", batch=1, size=64, precision="amp-bf16")
    card = parse_card("1GB", "10%")
    result = estimate(
        workload,
        [parse_strategy("none"), parse_strategy("every-block"), parse_strategy("offload")],
        card,
        max_size=256,
    )
    text = estimate_table(result)
    assert "dry run (meta device)" in text and "autocast(bf16)" in text
    assert "GPU-only" in text and "0.10 GiB held back" in text
    assert max(len(line) for line in text.splitlines()) <= 120
    lines = text.splitlines()  # caveats once, below the table; a tiny model's figures in MiB
    table_end = next(i for i, line in enumerate(lines) if line.startswith("every block,"))
    assert "dry run (meta device)" in "\n".join(lines[table_end:])
    assert "MiB;" in text and "dry run (meta device)" not in "\n".join(lines[:table_end])
    none, every, offload = result.rows
    assert every.flops_ratio > 1 and none.flops_ratio == 1
    assert offload.report is None and every.largest == 256


def test_the_table_shows_allocated_and_reserved_and_fits_by_the_replay(tiny_config):
    """Each measured row carries the allocator's predicted counters, in their own columns, and
    ``fits`` is the replay's answer for the card's budget, with the margin it leaves."""
    workload = Workload(f"hf:{tiny_config('llama')}", batch=1, size=64, precision="bf16")
    roomy = parse_card("1GB", gpu="h100")
    result = estimate(workload, [parse_strategy("none")], roomy, search=False)
    (row,) = result.rows
    assert row.report is not None and row.allocator is not None
    predicted = row.allocator
    assert predicted.max_allocated_bytes >= row.report.peak_bytes  # blocks, workspaces
    assert predicted.max_reserved_bytes >= predicted.max_allocated_bytes
    assert row.fits and predicted.margin_bytes == roomy.budget_bytes - predicted.max_reserved_bytes
    header = estimate_table(result).splitlines()
    columns = next(line for line in header if line.startswith("strategy")).split()
    assert columns[columns.index("alloc") :][:3] == ["alloc", "reserved", "smi"]
    assert "H100" in estimate_table(result) and "quoted, not measured" in estimate_table(result)
    # a budget of exactly the allocated peak holds the tensors but not the segments around them
    tight = Card("tight", predicted.max_allocated_bytes + roomy.context_bytes, gpu="h100")
    (tight_row,) = estimate(workload, [parse_strategy("none")], tight, search=False).rows
    assert tight_row.report is not None and tight_row.report.peak_bytes <= tight.budget_bytes
    assert not tight_row.fits and tight_row.allocator is not None
    assert tight_row.allocator.margin_bytes is not None and tight_row.allocator.margin_bytes < 0


def test_card_sizes():
    assert parse_bytes("24GB") == 24 * GiB == parse_bytes("24")
    assert parse_bytes("512MiB") == 512 * 2**20
    card = parse_card("80GB", "2GB")
    assert card.budget_bytes == 78 * GiB - card.context_bytes
    assert parse_card("80GB").budget_bytes == 80 * GiB - card.context_bytes
    for bad in ("24XB", "-3GB"):
        with pytest.raises(ValueError):
            parse_bytes(bad)
    with pytest.raises(ValueError, match="leave nothing"):
        parse_card("8GB", "8GB")
    with pytest.raises(ValueError, match="--gpu must be one of"):
        parse_card("8GB", gpu="v100")
    hopper = parse_card("80GB", gpu="H100", expandable_segments=True)
    assert hopper.workspace_bytes == cublas_workspace_bytes((9, 0)) and hopper.expandable_segments
    assert parse_card("80GB").workspace_bytes == cublas_workspace_bytes(None)


def test_command_prints_the_table(tiny_config, capsys):
    assert (
        main(
            [
                "estimate",
                "--hf-config",
                tiny_config("qwen2"),
                "--seq",
                "64",
                "--lora",
                "4",
                "--strategies",
                "none,every-block",
                "--card",
                "1GB",
                "--no-search",
            ]
        )
        == 0
    )
    out = " ".join(capsys.readouterr().out.split())  # the caveats are wrapped at 120 columns
    assert "Qwen2ForCausalLM" in out and "every block" in out and "not searched" in out


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--hf-preset", "llama-9"], "unknown preset"),
        (["--torchvision", "resnet5000"], "unknown torchvision"),
        (["--hf-preset", "gpt2", "--seq", "1"], "at least 2"),
        (["--hf-preset", "gpt2", "--seq", "0"], "positive integer"),
        (["--hf-preset", "gpt2", "--card", "lots"], "expected a size"),
        (["--hf-preset", "gpt2", "--strategies", "sometimes"], "unknown strategy"),
        (["--hf-preset", "gpt2", "--image-size", "64"], "--image-size is for"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(arguments, message, capsys):
    try:
        status = main(["estimate", *arguments, "--no-search"])
    except SystemExit as stop:
        status = stop.code
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert message in err[-1] and not any("Traceback" in line for line in err)


def test_command_replays_the_allocator_of_the_gpu_asked_for(tiny_config, capsys):
    arguments = ["estimate", "--hf-config", tiny_config("llama"), "--seq", "64"]
    arguments += ["--strategies", "none", "--card", "1GB", "--no-search"]
    assert main([*arguments, "--gpu", "h100", "--expandable-segments"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the caveats are wrapped at 120 columns
    each = "call" if cublas_workspace_per_call() else "thread"
    workspace = f"cuBLAS workspaces {cublas_workspace_bytes((9, 0)) / MiB:,.3g} MiB a {each}"
    assert "(H100)" in out and f"expandable segments; {workspace}" in out
    assert "quoted, not measured" in out and "alloc reserved smi" in out


def test_a_hub_model_offline_fails_in_seconds(monkeypatch, capsys):
    """The Hub unreachable (an endpoint whose name does not resolve): one line, no retries."""
    import time

    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "https://hub.invalid")
    monkeypatch.delenv("HTTPS_PROXY", raising=False)
    monkeypatch.delenv("https_proxy", raising=False)
    started = time.perf_counter()
    status = main(["estimate", "--hf-model", "nobody/no-such-model", "--no-search"])
    assert time.perf_counter() - started < 10
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and "the Hub cannot be reached" in err[-1] and "--hf-config" in err[-1]


def test_a_config_that_is_not_a_causal_lm(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "vit"}))
    assert main(["estimate", "--hf-config", str(path), "--no-search"]) == 2
    assert "not a causal language model" in capsys.readouterr().err


@pytest.mark.parametrize(
    "card, bf16_supported, precision",
    [
        (
            "a T4: bfloat16 emulated only",
            lambda including_emulation=True: including_emulation,
            "amp-fp16",
        ),
        ("an A100", lambda including_emulation=True: True, "amp-bf16"),
    ],
)
def test_the_autocast_dtype_follows_the_card(monkeypatch, card, bf16_supported, precision):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", bf16_supported)
    assert cuda_autocast_precision() == precision, card


def test_lora_dropout_keeps_a_dropped_input_per_projection(tiny_config):
    """``--lora-dropout``: the dry run equals a CPU step, and keeps more than at 0.0 (each
    adapted projection keeps its own dropped input and a mask, where at 0.0 they share one)."""
    peaks = []
    for dropout in (0.0, 0.1):
        workload = Workload(f"hf:{tiny_config('llama')}", batch=2, size=64, precision="fp32",
                            lora_rank=4, lora_dropout=dropout, optimizer="sgd")  # fmt: skip
        real, dry, model = real_and_dry(workload, parse_strategy("none"))
        assert real.breakdown == dry.breakdown
        peaks.append(dry.breakdown["activations"])
    assert peaks[1] > peaks[0]


def test_the_trainers_loop_frees_the_logits_before_backward(tiny_config):
    """``--loop trainer`` (the default) against ``--loop plain``: the peak falls by the logits
    (batch x sequence x vocabulary, bf16), which a plain loop keeps through backward."""
    peaks = {}
    for loop in ("plain", "trainer"):
        workload = Workload(f"hf:{tiny_config('llama')}", batch=2, size=64, precision="bf16",
                            loop=loop)  # fmt: skip
        peaks[loop] = train_step(build_model(workload), workload, parse_strategy("every-block"))
    logits_bytes = 2 * 64 * 500 * 2
    assert peaks["plain"].peak_bytes - peaks["trainer"].peak_bytes == logits_bytes
    assert Workload("hf:gpt2").loop == "trainer"


def test_json_has_every_figure_with_its_unit(tiny_config, capsys):
    argv = ["estimate", "--hf-config", tiny_config("llama"), "--seq", "64", "--gpu", "l4"]
    assert main([*argv, "--strategies", "none,offload", "--no-search", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    measured, offload = record["strategies"]
    assert measured["fits"] is True and offload["measured"] is False
    for key in ("activations_bytes", "predicted_max_reserved_bytes", "predicted_step_seconds"):
        assert measured[key] > 0
    assert measured["predicted_nvidia_smi_bytes"] == (
        measured["predicted_max_reserved_bytes"] + record["card"]["cuda_context_bytes"]
    )
    assert record["workload"]["loop"] == "trainer"
    assert measured["kept_at_loss_logits_and_loss_bytes"] > 0
    assert record["card"]["cublas_workspace_per_call"] is cublas_workspace_per_call()


@pytest.mark.parametrize("gpu", ["5090", "l40s", "a6000", "b200"])
def test_the_2026_cards_have_sourced_facts_and_run(tiny_config, gpu):
    from tutorial_utils.estimate.card import GPUS

    model = GPUS[gpu]
    assert model.sm is not None and model.memory_bytes and model.bandwidth
    assert model.bf16_flops and model.fp32_flops and model.peaks_source
    card = parse_card(None, gpu=gpu)
    assert card.total_bytes == model.memory_bytes  # the card's memory when --card is not given
    workload = Workload(f"hf:{tiny_config('llama')}", batch=1, size=64, precision="bf16")
    (row,) = estimate(workload, [parse_strategy("every-block")], card, search=False).rows
    assert row.fits and row.gpu is not None and row.gpu.predicted_seconds


def test_the_kept_activations_split_into_blocks_logits_and_the_rest(tiny_config):
    """Measured in the dry run: checkpointing shrinks the blocks' part; the Trainer's loop
    shrinks the logits' part by exactly the logits (batch x sequence x vocabulary, bf16)."""
    from tutorial_utils.estimate.breakdown import KeptForBackward

    kept = {}
    for loop in ("plain", "trainer"):
        workload = Workload(f"hf:{tiny_config('llama')}", batch=2, size=64, precision="bf16",
                            loop=loop)  # fmt: skip
        model = build_model(workload)
        for strategy in ("none", "every-block"):
            kept[loop, strategy] = KeptForBackward()
            train_step(model, workload, parse_strategy(strategy), kept=kept[loop, strategy])
    regions = {key: value.bytes_by_region for key, value in kept.items()}
    assert regions["trainer", "every-block"]["blocks"] < regions["trainer", "none"]["blocks"]
    logits = (
        regions["plain", "none"]["logits_and_loss"] - regions["trainer", "none"]["logits_and_loss"]
    )
    assert logits == 2 * 64 * 500 * 2
    assert (
        regions["trainer", "every-block"]["rest"] > 0
    )  # the embeddings, the first checkpoint's input


def test_a_search_from_the_table_dry_run_finds_the_same_edge(tiny_config):
    """The line through the table's own dry run only saves trials: the answer is the one the
    two-dry-run line finds, by the card's replay."""
    workload = Workload(f"hf:{tiny_config('llama')}", batch=1, size=256, precision="bf16")
    model = build_model(workload)
    probe = parse_card("1GB", "0", "any", False)
    every = parse_strategy("every-block")
    at_1536 = estimate(workload.with_size(size=1536), [every], probe, model=model, search=False)
    needed = at_1536.rows[0].allocator.max_reserved_bytes  # the replay's, workspaces included
    card = parse_card(f"{(needed + probe.context_bytes) / 2**20:.0f}MB", "0", "any", False)
    result = estimate(workload, [every], card, search=False)
    for row in result.rows:
        with as_gpu_runs(card):
            from_table = largest_fit(
                model, workload, row.strategy, card.budget_bytes, card=card, known=row.report,
                max_size=4096,
            )  # fmt: skip
            from_two_runs = largest_fit(
                model, workload, row.strategy, card.budget_bytes, card=card, max_size=4096
            )
        assert from_table[0] == from_two_runs[0] > 0
        assert from_table[1] <= from_two_runs[1]


def test_the_loss_sets_the_copies_of_the_logits_the_step_holds(tiny_config):
    """``--loss``: transformers 4.48's loss holds one more fp32 copy of the shifted logits than
    today's, and a loss on the bf16 logits holds no fp32 copy (the logits dominate here)."""
    batch, size, vocab = 2, 128, 4000
    config = tiny_config("llama", vocab_size=vocab)
    peaks = {}
    for loss in ("transformers", "transformers-4.48", "logits-dtype"):
        workload = Workload(f"hf:{config}", batch=batch, size=size, loss=loss)
        model = build_model(workload)
        peaks[loss] = train_step(model, workload, parse_strategy("every-block")).peak_bytes
    shifted_logits = batch * (size - 1) * vocab  # elements
    assert peaks["transformers-4.48"] - peaks["transformers"] >= 2 * shifted_logits
    assert peaks["transformers"] - peaks["logits-dtype"] >= 4 * shifted_logits


def test_the_loss_is_for_language_models():
    with pytest.raises(ValueError, match="--loss is for language models"):
        Workload("torchvision:resnet18", loss="logits-dtype")
