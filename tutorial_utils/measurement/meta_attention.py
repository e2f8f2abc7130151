"""What a dry run of a transformer needs to take the path a real CPU step takes.

Two things differ on the meta device unless they are dealt with:

* **The attention kernel.** ``scaled_dot_product_attention`` picks a kernel by device. On a CPU
  tensor without dropout it runs the fused flash kernel (it saves the output and a log-sum-exp,
  no sequence x sequence matrix); on a meta tensor it always falls back to the math path, which
  materialises the attention matrix. ``cpu_attention_on_meta`` asks the CPU's own selection function
  (on zero-stride stand-ins of the same shapes, dtypes and strides: no memory) and, where it
  picks flash, calls the flash kernel's meta implementation, so the dry run saves what the CPU
  step saves (``tests/test_checkpointing_a_transformer.py`` checks the peaks are equal).
* **Data-dependent checks.** ``transformers`` looks at the *values* of position ids to detect
  packed sequences (``(mask[:, -1] == 0).all()``); a meta tensor has no values. A dry run's batch
  is unpacked (one sequence per row, positions 0..s-1), for which the check answers "not packed":
  ``unpacked_dry_run_batches`` gives that answer for meta tensors and fake tensors (N GPUs'
  dry runs, ``estimate.sharded``; ``transformers`` takes a fake tensor for tracing and would
  build an explicit causal mask that a real step does not) and asks the real check for all
  others. A padding ``attention_mask`` is checked by value too; dry runs pass none (no padding).

Code that reads values for its own decisions (``if h.mean().item() > 0``, ``.tolist()``,
``torch.nonzero``) cannot be followed at all: ``values_explained`` turns PyTorch's error about it
into one line that says so and what to do instead (a real step at a size the machine can run).

``dry_run_context`` enters all three; ``measure_step`` enters it for every step on the meta device.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.attention import SDPBackend
from torch.utils._python_dispatch import _disable_current_modes

from tutorial_utils.measurement import gpu_attention

__all__ = [
    "cpu_attention_backend",
    "dry_run_context",
    "DryRunCannotFollow",
    "FLASH",
    "unpacked_dry_run_batches",
]

FLASH = SDPBackend.FLASH_ATTENTION.value


def _stand_in(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """A CPU tensor with ``tensor``'s shape, dtype and last stride, one row of real memory."""
    if tensor is None:
        return None
    row = torch.empty(tensor.shape[-1] * max(tensor.stride(-1), 1), dtype=tensor.dtype)
    return row.as_strided(tensor.shape, (0,) * (tensor.dim() - 1) + (tensor.stride(-1),))


def cpu_attention_backend(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
) -> int:
    """The ``SDPBackend`` (as an int) a CPU step would use for tensors of these shapes.

    Asked with every dispatch mode set aside, so a tracker or FLOP counter around the dry run
    sees neither the stand-ins nor the question."""
    with _disable_current_modes():
        return torch.ops.aten._fused_sdp_choice(
            *map(_stand_in, (query, key, value, attn_mask)),
            dropout_p,
            is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )


def _attention_on_meta(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
) -> torch.Tensor:
    """``scaled_dot_product_attention`` for meta tensors, through the kernel a CPU would pick
    (or, inside ``gpu_attention.gpu_attention_rules``, the kernel that GPU would pick)."""
    rules = gpu_attention.active_rules()
    if rules is not None:
        return gpu_attention.attention_on_meta(
            rules, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
        )
    if attn_mask is not None and attn_mask.dtype == torch.bool:  # as SDPA converts it first
        attn_mask = torch.where(attn_mask, 0.0, float("-inf")).to(query.dtype)
    choice = cpu_attention_backend(
        query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
    )
    gpu_attention.note_kernel("cpu-flash" if choice == FLASH else "cpu-math")
    if choice == FLASH:
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        return flash(query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]
    math_path = torch.ops.aten._scaled_dot_product_attention_math
    return math_path(
        query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
    )[0]


@contextlib.contextmanager
def cpu_attention_on_meta() -> Iterator[None]:
    """Inside it, ``scaled_dot_product_attention`` on meta tensors runs the kernel a CPU would.

    A kernel registration, not a mode: it holds in autograd's threads too, where checkpoints
    recompute. Registered for the meta device's autograd key only; removed on exit.
    """
    library = torch.library.Library("aten", "IMPL")
    library.impl("scaled_dot_product_attention", _attention_on_meta, "AutogradMeta")
    try:
        yield
    finally:
        library._destroy()  # unregisters now, not whenever the object is collected


@contextlib.contextmanager
def unpacked_dry_run_batches() -> Iterator[None]:
    """``transformers``' packed-sequence check answers "not packed" for meta and fake position
    ids (a dry run's: no values), as it does for a real unpacked batch."""
    masking: Any = sys.modules.get("transformers.masking_utils")  # patched: typed loosely
    if masking is None:  # transformers not imported: nothing to answer for
        yield
        return
    from torch._subclasses.fake_tensor import FakeTensor

    original = masking.find_packed_sequence_indices

    def find_packed_sequence_indices(position_ids: torch.Tensor) -> torch.Tensor | None:
        shapes_only = position_ids.device.type == "meta" or isinstance(position_ids, FakeTensor)
        return None if shapes_only else original(position_ids)

    masking.find_packed_sequence_indices = find_packed_sequence_indices
    try:
        yield
    finally:
        masking.find_packed_sequence_indices = original


class DryRunCannotFollow(RuntimeError):
    """A dry run met code that reads tensor values, which meta tensors do not have."""


# the start of what PyTorch says when code asks a meta tensor for its values
READS_VALUES = (
    "Tensor.item() cannot be called on meta tensors",  # .item(), bool(), int(), float(), if
    "Cannot copy out of meta tensor",  # .tolist(), .cpu(), .numpy()
    "can't convert meta device type tensor",
    "a correct data-independent implementation does not exist",  # nonzero, boolean masks
)


@contextlib.contextmanager
def values_explained() -> Iterator[None]:
    """Inside it, code that reads a meta tensor's values fails with ``DryRunCannotFollow``: one
    line saying a dry run cannot follow it and what to do instead."""
    try:
        yield
    except (RuntimeError, NotImplementedError, TypeError) as error:
        if not any(text in str(error) for text in READS_VALUES):
            raise
        said = str(error).strip().splitlines()[0].split(". ")[0]  # its first sentence
        raise DryRunCannotFollow(
            f"a dry run cannot follow code that reads tensor values (PyTorch: {said}); measure a "
            "real step instead: measure_step on cpu or cuda at a batch size this machine can run"
        ) from error


@contextlib.contextmanager
def dry_run_context() -> Iterator[None]:
    """All of the above: a meta step of a transformer takes a CPU step's path, and a model that
    reads values says why a dry run cannot follow it."""
    with values_explained(), unpacked_dry_run_batches(), cpu_attention_on_meta():
        yield
