"""Autocast on the meta device: absent in PyTorch, emulated by ``measurement.autocast``."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tutorial_utils.measurement.autocast import CPU_POLICY, CUDA_POLICY, EmulatedAutocast


def test_torch_autocast_does_not_apply_to_meta_tensors():
    """Why the emulation exists: a meta linear under CPU autocast stays float32."""
    weight = torch.empty(4, 4, device="meta", requires_grad=True)
    inputs = torch.empty(2, 4, device="meta")
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        assert torch.nn.functional.linear(inputs, weight).dtype == torch.float32
        assert (
            torch.nn.functional.linear(torch.ones(2, 4), torch.ones(4, 4)).dtype == torch.bfloat16
        )


@pytest.mark.parametrize(
    ("policy", "key"), [(CUDA_POLICY, "AutocastCUDA"), (CPU_POLICY, "AutocastCPU")]
)
def test_every_emulated_op_is_one_the_device_autocasts(policy, key):
    """The lists are written from PyTorch's newest source; the emulation casts the ops the
    installed torch registers, which on the release the suite runs is every listed op (an
    older torch casts a few fewer: torch 2.9 leaves CUDA's rms_norm alone)."""
    listed, emulated = list(policy.items()), list(policy.installed())
    assert all(
        torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", key) for name, _ in emulated
    )
    if torch.__version__.startswith("2.14."):
        assert emulated == listed
    assert len(listed) - len(emulated) <= 1


def test_emulation_casts_as_autocast_does_and_only_inside():
    emulation = EmulatedAutocast(torch.bfloat16, CUDA_POLICY)
    weight = torch.empty(4, 4, device="meta", requires_grad=True)
    inputs = torch.empty(2, 4, device="meta")
    with emulation.kernels():
        with emulation.enabled():
            out = torch.nn.functional.linear(inputs, weight)
            again = torch.nn.functional.linear(inputs, weight)
            assert out.dtype == torch.bfloat16
            assert torch.softmax(out, -1).dtype == torch.float32  # fp32_set_opt_dtype
            assert torch.layer_norm(out, (4,)).dtype == torch.float32  # CUDA's fp32 list
            with emulation.disabled():
                assert torch.nn.functional.linear(inputs, weight).dtype == torch.float32
            # the weight's cast is made once and kept (autocast's cache): one _to_copy
            assert (
                out.grad_fn.next_functions[1][0].next_functions[0][0]
                is (again.grad_fn.next_functions[1][0].next_functions[0][0])
            )
        assert torch.nn.functional.linear(inputs, weight).dtype == torch.float32
    assert torch.nn.functional.linear(inputs, weight).dtype == torch.float32


def test_cpu_and_cuda_policies_differ_where_pytorch_says():
    """LayerNorm runs in float32 under CUDA autocast, in the input's dtype under CPU's."""
    cuda = dict((n, p) for n, p in CUDA_POLICY.items())
    cpu = dict((n, p) for n, p in CPU_POLICY.items())
    assert cuda["layer_norm"] == "fp32" and "layer_norm" not in cpu
    assert cpu["cross_entropy_loss"] == "fp32" and "cross_entropy_loss" not in cuda


def test_emulation_rejects_other_dtypes():
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        EmulatedAutocast(torch.float32)


def test_a_dry_run_inside_torch_autocast_follows_it():
    """Meta tensors ignore a real ``torch.autocast``; ``dry_run_step`` reads it and emulates it,
    so a dry run inside the ``with`` block counts the mixed-precision step, not the float32 one."""
    from torchvision.models import resnet18

    from tutorial_utils.measurement.autocast import ambient_autocast
    from tutorial_utils.measurement.dry_run import dry_run_step

    model, shape = resnet18(num_classes=2), (2, 3, 32, 32)
    plain = dry_run_step(model, shape).peak_bytes
    explicit = dry_run_step(model, shape, autocast=EmulatedAutocast(torch.bfloat16, CPU_POLICY))
    assert ambient_autocast() is None
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        followed = ambient_autocast()
        assert followed is not None and followed.dtype == torch.bfloat16
        assert followed.policy is CPU_POLICY
        inside = dry_run_step(model, shape).peak_bytes
    assert inside == explicit.peak_bytes != plain


def test_a_dry_run_inside_torch_autocast_equals_the_real_step_under_it():
    """ResNet-18 on the CPU in bf16: ``measure_step`` inside ``torch.autocast`` casts the forward
    and the loss only (backward and the optimizer step outside it, as an AMP loop does), and a dry
    run inside the same ``with`` block counts that step to the byte, not the float32 one."""
    from torchvision.models import resnet18

    from tutorial_utils.measurement.dry_run import dry_run_step
    from tutorial_utils.measurement.step import measure_step

    torch.manual_seed(0)
    model, shape = resnet18(num_classes=2), (2, 3, 32, 32)
    inputs, targets = torch.randn(shape), torch.randint(0, 2, (shape[0],))
    fp32 = dry_run_step(model, shape)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        dry = dry_run_step(model, shape)
        real = measure_step(model, inputs, targets, time_step=False)
    explicit = measure_step(model, inputs, targets, time_step=False, autocast=dry_autocast())
    for report in (real, explicit):
        assert (dry.peak_bytes, dry.activation_peak_bytes) == (
            report.peak_bytes,
            report.activation_peak_bytes,
        )
        assert dry.phase_peak_bytes == report.phase_peak_bytes
    assert dry.peak_bytes != fp32.peak_bytes  # the float32 step is another figure


def dry_autocast() -> EmulatedAutocast:
    return EmulatedAutocast(torch.bfloat16, CPU_POLICY)


def _conv_chain() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(16 * 16 * 16, 4),
    )


def test_the_batch_search_and_the_floor_follow_torch_autocast():
    """Inside ``torch.autocast`` the search's trials and the floor are those of the mixed-precision
    step: the float32 floor would lie above the real bf16 steps, the autocast one lies below."""
    from tutorial_utils.checkpointing.strategy import equal_segments
    from tutorial_utils.measurement.batch_search import find_max_batch_size
    from tutorial_utils.measurement.dry_run import dry_run_step, meta_copy
    from tutorial_utils.measurement.step import measure_step
    from tutorial_utils.planning.limits import peak_floor

    shape, budget = (8, 3, 16, 16), 2 * 2**20
    meta_batch = (
        torch.empty(shape, device="meta"),
        torch.empty(8, dtype=torch.long, device="meta"),
    )
    inputs, targets = torch.randn(shape), torch.randint(0, 4, (shape[0],))
    fp32_floor = peak_floor(meta_copy(_conv_chain()), *meta_batch)
    fp32_search = find_max_batch_size(_conv_chain, shape[1:], budget, device="meta", max_batch=64)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        floor = peak_floor(meta_copy(_conv_chain()), *meta_batch)
        search = find_max_batch_size(_conv_chain, shape[1:], budget, device="meta", max_batch=64)
        real_peaks = [
            measure_step(
                _conv_chain(), inputs, targets, equal_segments(count), time_step=False
            ).peak_bytes
            for count in (0, 2, 3)
        ]
    assert floor == peak_floor(meta_copy(_conv_chain()), *meta_batch, autocast=dry_autocast())
    assert floor.floor_bytes <= min(real_peaks) < fp32_floor.floor_bytes
    assert search.batch_size > fp32_search.batch_size
    best = next(t for t in search.trials if t.fits and t.batch_size == search.batch_size)
    explicit = dry_run_step(_conv_chain(), (best.batch_size, *shape[1:]), autocast=dry_autocast())
    assert best.peak_bytes == explicit.peak_bytes


def test_the_emulation_reads_no_module_attribute_that_warns(monkeypatch: pytest.MonkeyPatch):
    """Issue 46: notebook 07 printed torch.jit.script_method's FutureWarning because entering the
    emulation's kernels asked every loaded module (torch.utils.mkldnn among them) for an
    attribute. With warnings as errors, entering them must stay silent, and transformers'
    ``maybe_autocast`` is still found and put back."""
    import sys
    import types
    import warnings

    import torch.utils.mkldnn  # noqa: F401 (loaded, as a notebook has it)

    fake = types.ModuleType("transformers.fake_for_test")
    fake.maybe_autocast = original = lambda device_type, **kwargs: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    emulation = EmulatedAutocast(torch.bfloat16, CPU_POLICY)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with emulation.kernels():
            assert fake.maybe_autocast is not original  # type: ignore[attr-defined]
    assert fake.maybe_autocast is original  # type: ignore[attr-defined]
