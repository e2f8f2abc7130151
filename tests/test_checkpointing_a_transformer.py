"""Notebook 06's mechanics on small transformers: strategies, dry runs, messages, fits."""

from __future__ import annotations

import json
import warnings
from functools import partial

import pytest
import torch
import torch.nn as nn

from tutorial_utils.__main__ import main
from tutorial_utils.articles.profiles import PROFILES
from tutorial_utils.checkpointing.blocks import checkpointed_blocks
from tutorial_utils.checkpointing.selective import MATRIX_PRODUCT_OPS, saving_policy
from tutorial_utils.checkpointing.strategy import offloaded
from tutorial_utils.display.figure_check import figure_problems
from tutorial_utils.estimate.estimator import Workload
from tutorial_utils.estimate.models import build_causal_lm, decoder_blocks, trainable_parameters
from tutorial_utils.estimate.strategies import parse_strategy
from tutorial_utils.lessons.checkpointing_a_transformer import (
    StrategyExplorer,
    adamw,
    fit_table,
    lm_step,
    longest_sequences,
    sizes_for,
    small_gpt2_config,
    small_llama_config,
    strategy_rows,
    token_batch,
    transformer_menu,
)
from tutorial_utils.measurement.batch_search import largest_fitting
from tutorial_utils.measurement.dry_run import dry_run_step
from tutorial_utils.measurement.meta_attention import (
    FLASH,
    cpu_attention_backend,
    dry_run_context,
    unpacked_dry_run_batches,
)
from tutorial_utils.measurement.saved_tensors import OUTSIDE, saved_bytes_per_module
from tutorial_utils.measurement.step import Recording, measure_step, next_token_loss
from tutorial_utils.measurement.tracker import TensorMemoryTracker

CONFIGS = {
    "llama": lambda: small_llama_config(layers=3, hidden=64),
    "gpt2": lambda: small_gpt2_config(layers=3, hidden=64),
}
BATCH, SEQUENCE = 2, 64
ADAM_STEP_BYTES = 4  # AdamW's float32 step counter per parameter, kept on the CPU


def menu_for(model):
    return transformer_menu(len(decoder_blocks(model)))


@pytest.mark.parametrize("kind", CONFIGS)
def test_dry_run_peak_equals_a_cpu_step_under_every_strategy(kind):
    cpu = build_causal_lm(CONFIGS[kind]())
    meta = build_causal_lm(CONFIGS[kind](), "meta")
    step_counters = ADAM_STEP_BYTES * len(trainable_parameters(cpu))
    for strategy in menu_for(cpu):
        real = lm_step(cpu, strategy, BATCH, SEQUENCE)
        dry = lm_step(meta, strategy, BATCH, SEQUENCE)
        # the only difference: Adam's step counters, CPU tensors a meta-device count leaves out
        assert real.peak_bytes - dry.peak_bytes == step_counters, strategy.name
        assert dry.dry_run and dry.seconds is None and real.seconds is None


def _gradients(model, ids):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # the same dropout masks in every run
    next_token_loss(model(ids), ids).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("kind", CONFIGS)
def test_gradients_equal_with_and_without_each_strategy(kind):
    model = build_causal_lm(CONFIGS[kind]())
    ids = token_batch(BATCH, SEQUENCE, "cpu", model.config.vocab_size)
    menu = menu_for(model)
    with menu[0].applied(model):
        reference = _gradients(model, ids)
    for strategy in menu[1:]:
        with strategy.applied(model):
            grads = _gradients(model, ids)
        assert grads.keys() == reference.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(
                grad, reference[name], rtol=1e-4, atol=1e-6, msg=f"{strategy.name}: {name}"
            )
    assert {s.kind for s in menu} >= {"none", "every-n", "selective"}


def test_strategies_change_what_is_kept_and_recomputed():
    meta = build_causal_lm(small_llama_config(layers=4, hidden=256), "meta")
    rows = {r["checkpointing"]: r for r in strategy_rows(meta, menu_for(meta), 4, 512)}
    none, full = rows["none"], rows["every block (default)"]
    half = rows["every 2nd block"]
    selective = rows["selective: save matmuls"]
    assert none["recompute_gflop"] == 0 < half["recompute_gflop"] < full["recompute_gflop"]
    assert full["activation_peak_mib"] < half["activation_peak_mib"] < none["activation_peak_mib"]
    assert 0 < selective["recompute_gflop"] < full["recompute_gflop"]  # attention recomputed
    assert full["activation_peak_mib"] < selective["activation_peak_mib"]
    both = rows["selective: save matmuls + attention"]
    assert both["recompute_gflop"] < selective["recompute_gflop"]
    assert all(r["source"].startswith("dry run") for r in rows.values())


def test_meta_attention_takes_the_kernel_a_cpu_step_takes():
    q = torch.empty(2, 4, 128, 16, device="meta")
    assert cpu_attention_backend(q, q, q, is_causal=True) == FLASH
    assert cpu_attention_backend(q, q, q, dropout_p=0.1, is_causal=True) != FLASH
    cpu = build_causal_lm(small_llama_config())
    meta = build_causal_lm(small_llama_config(), "meta")
    peaks = {}
    for name, model, context in (
        ("cpu", cpu, torch.enable_grad()),
        ("meta, kernel as on a CPU", meta, dry_run_context()),
        ("meta, default", meta, unpacked_dry_run_batches()),
    ):
        device = next(model.parameters()).device.type
        ids = token_batch(BATCH, 256, device, 1000)
        tracker = TensorMemoryTracker(model, device=device)
        with context, tracker:
            next_token_loss(model(ids), ids).backward()
        model.zero_grad(set_to_none=True)
        peaks[name] = tracker.peak_bytes
    assert peaks["meta, kernel as on a CPU"] == peaks["cpu"] < peaks["meta, default"]


def test_flop_counting_leaves_the_dry_run_peak_unchanged():
    meta = build_causal_lm(small_llama_config(), "meta")
    ids = token_batch(BATCH, SEQUENCE, "meta", 1000)
    counted, plain = (
        measure_step(
            meta,
            ids,
            ids,
            optimizer_factory=adamw,
            loss_fn=next_token_loss,
            recording=Recording(count_flops=c),
        )
        for c in (True, False)
    )
    assert counted.peak_bytes == plain.peak_bytes and counted.flops.forward > 0


def test_dry_run_step_takes_token_ids():
    meta = build_causal_lm(small_gpt2_config(), "meta")
    report = dry_run_step(meta, (BATCH, SEQUENCE), token_ids=True)
    assert report.dry_run and report.breakdown["activations"] > 0
    with pytest.raises(ValueError, match="batch, sequence"):
        dry_run_step(meta, (BATCH, SEQUENCE, 3), token_ids=True)


def test_checkpointed_blocks_restores_the_forward_it_replaced():
    model = build_causal_lm(small_llama_config())
    blocks = decoder_blocks(model)
    with checkpointed_blocks(blocks, use_reentrant=False):
        assert all("forward" in vars(block) for block in blocks)
    assert not any("forward" in vars(block) for block in blocks)
    with pytest.raises(ValueError, match="no blocks"):
        with checkpointed_blocks([], use_reentrant=False):
            pass


def test_saved_bytes_are_charged_to_the_innermost_module():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    saved = saved_bytes_per_module(model, {"first": model[0], "rest": model[2]}, lambda: model(x))
    assert saved["first"] == x.nbytes  # the linear keeps its input
    assert saved[OUTSIDE] == 3 * 8 * 4  # the ReLU keeps its output (also the last input: once)
    assert saved["rest"] == 0
    with pytest.raises(ValueError, match="modules is empty"):
        saved_bytes_per_module(model, {}, lambda: model(x))


@pytest.mark.parametrize("start", [1, 3, 17, 40, 100])
@pytest.mark.parametrize("answer", [0, 1, 7, 32, 64])
def test_largest_fitting_finds_the_boundary_from_any_start(start, answer):
    tried = []

    def fits(value):
        tried.append(value)
        return value <= answer

    assert largest_fitting(fits, 64, start=start) == answer
    assert len(tried) <= 16


def test_notebook_and_command_line_give_the_same_longest_sequences(tmp_path, capsys):
    """Notebook 06's table (``longest_sequences``) and ``python -m tutorial_utils estimate`` read
    the same longest sequence for every strategy: one engine (issue 41). A tiny config keeps it
    cheap."""
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 2,
              "vocab_size": 32000, "max_position_embeddings": 2048}  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    workload = Workload(f"hf:{path}", batch=1, size=512, lora_rank=4)
    fits = longest_sequences(workload, ["none", "every-block"], ["1GB"])
    notebook = {strategy: sequence for (strategy, _), (sequence, _) in fits.items()}
    assert "every block" in fit_table(fits) and "1GB" in fit_table(fits)
    args = ["estimate", "--hf-config", str(path), "--seq", "512", "--lora", "4", "--card", "1GB"]
    assert main([*args, "--strategies", "none,every-block", "--jobs", "1", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)  # --json: every figure, units in the names
    command = {row["strategy"]: row["largest_sequence_tokens"] for row in printed["strategies"]}
    assert command == notebook
    assert 0 < notebook["none"] <= notebook["every block"]
    with pytest.raises(ValueError, match="at least one strategy"):
        longest_sequences(workload, [], ["1GB"])


def test_every_profile_searches_strategies_the_command_line_takes():
    for profile in PROFILES.values():
        assert all(parse_strategy(name) for name in sizes_for(profile).fit_strategies)


def test_bad_input_gets_a_one_line_error():
    with pytest.raises(ValueError, match="sequence >= 2"):
        token_batch(1, 1, "cpu", 10)
    with pytest.raises(ValueError, match="ops is empty"):
        saving_policy(frozenset())
    assert saving_policy(MATRIX_PRODUCT_OPS)(None, torch.ops.aten.mm.default).name == "MUST_SAVE"
    with pytest.raises(ValueError, match="run it on CUDA"):
        with offloaded().applied(build_causal_lm(small_gpt2_config(), "meta")):
            pass


def test_explorer_dry_runs_every_strategy_and_follows_its_sliders():
    models = {
        "GPT-2": build_causal_lm(small_gpt2_config(layers=4), "meta"),
        "Llama": build_causal_lm(small_llama_config(layers=4), "meta"),
    }
    explorer = StrategyExplorer(models, batch=2, sequence=64)
    figure, table = explorer.panel.run()
    assert not figure_problems(figure)
    assert "dry run (meta device)" in table
    for strategy in transformer_menu(4):
        assert strategy.name in table
    explorer.panel.controls["sequence"].value = 128
    _, longer = explorer.panel.run()
    assert longer != table and "batch 2 x 128" in longer
    explorer.panel.controls["model"].value = "Llama"
    _, llama = explorer.panel.run()
    assert llama.startswith("Llama")
    explorer.panel.controls["model"].value = "GPT-2"
    explorer.panel.controls["sequence"].value = 2048  # past GPT-2's context: said, not predicted
    with pytest.raises(ValueError, match="at most 1,024 tokens"):
        explorer.panel.run()


def test_selective_checkpointing_under_saved_tensor_hooks_warns_only_when_left_unset():
    """Notebook 06 counts a selective policy's kept bytes with the tools' saved-tensor hooks and
    passes respect_saved_tensors_hooks=True: no FutureWarning, and the kept bytes are counted."""
    from torch.utils.checkpoint import (
        CheckpointPolicy,
        checkpoint,
        create_selective_checkpoint_contexts,
    )

    from tutorial_utils.tools import SavedTensors

    def keep_matmuls(ctx, op, *args, **kwargs):
        keep = op == torch.ops.aten.mm.default
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    weight = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(32, 64, requires_grad=True)

    def kept(**hooks) -> int:
        context = partial(create_selective_checkpoint_contexts, keep_matmuls)
        with SavedTensors(leave_out=[weight]) as saved:
            checkpoint(lambda t: (t @ weight).relu(), x, use_reentrant=False,
                       context_fn=context, **hooks)  # fmt: skip
        return saved.total_bytes

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        honoured = kept(respect_saved_tensors_hooks=True)
    with pytest.warns(FutureWarning, match="respect_saved_tensors_hooks"):
        legacy = kept()
    assert honoured == legacy + 32 * 64 * 4  # the policy's kept matmul output is counted too
