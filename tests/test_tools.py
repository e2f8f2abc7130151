"""tools.py: the same functions notebook 01 writes in its cells, and what they measure."""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import re
import statistics
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    checkpoint_sequential,
    create_selective_checkpoint_contexts,
)

from tutorial_utils import tools
from tutorial_utils.measurement.tracker import TensorMemoryTracker
from tutorial_utils.tools import (
    LiveBytes,
    SavedTensors,
    StepTimes,
    compare_times,
    peak_bytes,
    saved_bytes,
    step_flops,
    time_turns,
)

ROOT = Path(__file__).resolve().parent.parent
SAVE_MARK = "# @save"
TEACHING_NOTEBOOK = ROOT / "notebooks" / "01_toy_summation_graph.ipynb"


def definitions(source: str) -> dict[str, str]:
    """Top-level functions, classes and constants of ``source``, each by name, as written."""
    found = {}
    source = re.sub(r"^\s*[%!].*$", "", source, flags=re.MULTILINE)  # IPython magics
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            found[node.name] = ast.get_source_segment(source, node, padded=True)
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            found[node.targets[0].id] = ast.get_source_segment(source, node)
    found.pop("__all__", None)  # the module's public surface, not a tool
    return found


def saved_cells(path: Path) -> dict[str, str]:
    notebook = nbformat.read(path, as_version=4)
    found: dict[str, str] = {}
    for cell in notebook.cells:
        if cell.cell_type == "code" and cell.source.startswith(SAVE_MARK):
            found.update(definitions(cell.source))
    return found


def test_notebook_01_writes_every_tool_in_a_cell_as_the_module_keeps_it() -> None:
    in_cells = saved_cells(TEACHING_NOTEBOOK)
    in_module = definitions(inspect.getsource(tools))
    assert set(in_cells) == set(in_module), (
        f"only in notebook 01: {sorted(set(in_cells) - set(in_module))}; "
        f"only in tools.py: {sorted(set(in_module) - set(in_cells))}"
    )
    changed = [name for name in in_module if in_cells[name] != in_module[name]]
    assert not changed, f"{changed} differ between notebook 01's '# @save' cells and tools.py"


def test_no_other_notebook_redefines_a_tool() -> None:
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        if path != TEACHING_NOTEBOOK:
            notebook = nbformat.read(path, as_version=4)
            for cell in notebook.cells:
                if cell.cell_type == "code":
                    again = set(definitions(cell.source)) & set(
                        definitions(inspect.getsource(tools))
                    )
                    assert not again, f"{path.name} redefines {again}: import them from tools"


def chain(depth: int = 8, width: int = 32) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)])


def test_saved_bytes_counts_what_backward_keeps_by_hand() -> None:
    model, x = chain(), torch.randn(16, 32)
    unit = x.numel() * x.element_size()
    # plain: the input of the first Linear, then each ReLU's output (the next Linear saves the
    # same storage); the weights are left out
    assert saved_bytes(model, lambda: model(x)) == 9 * unit
    # 4 segments: the inputs of the 3 checkpointed ones, then the last segment as usual (2 blocks)
    forward = lambda: checkpoint_sequential(model, 4, x, use_reentrant=False)  # noqa: E731
    assert saved_bytes(model, forward) == (3 + 1 + 2) * unit
    with torch.no_grad():
        assert saved_bytes(model, lambda: model(x)) == 0


def test_saved_tensors_counts_the_same_bytes_on_meta_as_on_cpu() -> None:
    """Every storage on meta has data_ptr() 0: only a count keyed by the storage itself holds."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
    on_meta, x = copy.deepcopy(model).to("meta"), torch.randn(2, 3, 16, 16)
    with SavedTensors(leave_out=model.parameters()) as cpu:
        model(x)
    with SavedTensors(leave_out=on_meta.parameters()) as meta:
        on_meta(x.to("meta"))
    assert len(meta.storages) == len(cpu.storages) > 3  # input, conv out, BN stats, ReLU out
    assert meta.total_bytes == cpu.total_bytes == sum(cpu.storages.values())
    assert saved_bytes(on_meta, lambda: on_meta(x.to("meta"))) == cpu.total_bytes
    assert {p.untyped_storage() for p in model.parameters()}.isdisjoint(cpu.storages)


@pytest.mark.filterwarnings("error::FutureWarning")  # torch 2.15: SAC under hooks, unset, warns
def test_saved_tensors_sees_only_the_inputs_of_a_selective_region_as_documented() -> None:
    model, x = chain(depth=2), torch.randn(16, 32)
    unit = x.numel() * x.element_size()

    def keep_matmuls(_ctx, op, *_args, **_kwargs) -> CheckpointPolicy:
        if op is torch.ops.aten.addmm.default:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    selective = functools.partial(create_selective_checkpoint_contexts, keep_matmuls)
    respects = "respect_saved_tensors_hooks" in inspect.signature(checkpoint).parameters

    def counted(**options) -> SavedTensors:
        with SavedTensors(leave_out=model.parameters()) as saved:
            checkpoint(model, x, use_reentrant=False, context_fn=selective, **options)
        return saved

    legacy = counted(**({"respect_saved_tensors_hooks": False} if respects else {}))
    assert list(legacy.storages) == [x.untyped_storage()]  # the region's input, nothing it keeps
    if respects:  # torch 2.14+: the two Linears' outputs the policy keeps come through too
        honoured = counted(respect_saved_tensors_hooks=True)
        assert honoured.total_bytes == legacy.total_bytes + 2 * unit
        with pytest.warns(FutureWarning, match="respect_saved_tensors_hooks"):
            counted()  # what the explicit argument avoids, and what the mark above turns to errors


@pytest.mark.parametrize("segments", [0, 2, 4])
def test_peak_bytes_equals_the_package_tracker(segments: int) -> None:
    model, x = chain(), torch.randn(64, 32)
    y = torch.randint(0, 32, (64,))

    def step() -> None:
        out = (
            checkpoint_sequential(model, segments, x, use_reentrant=False) if segments else model(x)
        )
        nn.functional.cross_entropy(out, y).backward()
        model.zero_grad(set_to_none=True)

    with TensorMemoryTracker(model=model, inputs=[x, y]) as tracker:
        step()
    assert peak_bytes(step) == tracker.peak_bytes - tracker.baseline_bytes


def test_peak_bytes_counts_a_free_of_what_the_step_started_with_as_cuda_does() -> None:
    """CUDA's max_memory_allocated() - start reads 0 for a step that frees a 4 MiB tensor it
    started with and then allocates 4 MiB; counting only what the step allocates reads 4 MiB."""
    held = [torch.ones(2**20)]  # alive before the step; the step drops the last reference

    def step() -> None:
        held.clear()
        held.append(torch.zeros(2**20))

    assert peak_bytes(step) == 0
    assert peak_bytes(lambda: held.append(torch.zeros(2**20))) == 4 * 2**20


def test_peak_bytes_counts_freed_gradients_as_the_tracker_does() -> None:
    """A training step that starts by freeing the last step's gradients (zero_grad)."""
    model, x = chain(), torch.randn(64, 32)
    y = torch.randint(0, 32, (64,))

    def step() -> None:
        model.zero_grad(set_to_none=True)  # frees the gradients the step started with
        nn.functional.cross_entropy(model(x), y).backward()

    step()  # gradients exist before each measured step
    with TensorMemoryTracker(model=model, inputs=[x, y]) as tracker:
        step()
    assert peak_bytes(step) == tracker.peak_bytes - tracker.baseline_bytes


def test_live_bytes_skips_views_and_in_place_results_and_sees_frees() -> None:
    x = torch.zeros(1024)
    with LiveBytes() as counter:
        y = x + 1  # 4 KiB new
        y.add_(1)  # in place: nothing new
        y.view(32, 32).t()  # views: nothing new
        z = y * 2  # 4 KiB new
        del z
        after_free = counter.now_bytes
    assert counter.peak_bytes == 2 * 4096
    assert after_free == 4096


def test_step_flops_counts_a_matmul_and_the_recompute() -> None:
    layer, x = nn.Linear(64, 32, bias=False), torch.randn(8, 64)
    assert step_flops(lambda: layer(x)) == 2 * 8 * 64 * 32
    model, x = chain(depth=4), torch.randn(8, 32, requires_grad=True)
    plain = step_flops(lambda: model(x).sum().backward())
    checkpointed = step_flops(
        lambda: checkpoint_sequential(model, 2, x, use_reentrant=False).sum().backward()
    )
    assert checkpointed > plain  # the first segment's Linears run again


def test_time_turns_interleaves_on_one_thread_and_restores_threads() -> None:
    calls, threads_seen = [], []

    def step(name: str):
        return lambda: (calls.append(name), threads_seen.append(torch.get_num_threads()))

    before = torch.get_num_threads()
    times = time_turns({"a": step("a"), "b": step("b")}, turns=3)
    assert calls == ["a", "b"] + ["a", "b"] * 3  # one untimed warm-up each, then turns
    assert set(threads_seen) == {1} and torch.get_num_threads() == before
    assert all(len(t.cpu_s) == len(t.wall_s) == 3 for t in times.values())


def test_compare_times_says_beyond_noise_only_when_the_ranges_are_apart() -> None:
    base = StepTimes([1.0, 1.1, 1.2], [1.0, 1.1, 1.2])
    apart = StepTimes([1.5, 1.6, 1.7], [1.3, 1.6, 1.7])
    overlapping = StepTimes([1.15, 1.3, 1.4], [1.15, 1.3, 1.4])
    text = compare_times({"plain": base, "ckpt": apart, "close": overlapping}, "plain")
    lines = {(line.split()[0], line.split()[2]): line for line in text.splitlines()}
    assert lines[("cpu", "ckpt")].endswith("beyond noise: True")
    assert lines[("cpu", "close")].endswith("beyond noise: False")
    ratio = statistics.median(apart.cpu_s) / statistics.median(base.cpu_s)
    assert f"x{ratio:.2f}" in lines[("cpu", "ckpt")]
    assert "beyond noise" not in lines[("wall", "plain")]
