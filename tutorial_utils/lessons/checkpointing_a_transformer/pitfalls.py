"""The pitfalls, executed: LoRA + reentrant checkpointing, the ``use_cache`` warning, the default."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn
import transformers
from peft import PeftModel
from transformers import PreTrainedModel

from tutorial_utils.checkpointing.blocks import checkpointed_blocks
from tutorial_utils.checkpointing.transformers_api import (
    disable_checkpointing,
    enable_checkpointing,
)
from tutorial_utils.display.tables import text_table
from tutorial_utils.estimate.models import (
    decoder_blocks,
)
from tutorial_utils.lessons.checkpointing_a_transformer.models import (
    CausalLM,
)
from tutorial_utils.lessons.checkpointing_a_transformer.strategies import (
    token_batch,
)
from tutorial_utils.measurement.gradients import named_gradients
from tutorial_utils.measurement.step import next_token_loss

# -- the pitfalls ---------------------------------------------------------------------------------


@dataclass
class GradientCheck:
    """One way of running the LoRA model: which trainable parameters got a gradient."""

    name: str
    missing: list[str]  # trainable parameters whose .grad is None
    trainable: int
    max_difference: float | None  # largest |grad - reference grad| over the others
    warnings: list[str]
    error: str | None = None

    @property
    def matches(self) -> bool:
        """Every trainable parameter has the un-checkpointed run's gradient (to 1e-5)."""
        return (
            self.error is None
            and not self.missing
            and self.max_difference is not None
            and self.max_difference < 1e-5
        )


def _gradients(model: nn.Module, ids: torch.Tensor) -> tuple[dict, list[str], str | None]:
    model.zero_grad(set_to_none=True)
    caught: list[str] = []
    error = None
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        try:
            next_token_loss(model(ids), ids).backward()
        except RuntimeError as failure:
            error = str(failure).splitlines()[0]
    caught = sorted({str(r.message) for r in records})
    return named_gradients(model), caught, error


def lora_pitfall(model: PeftModel, sequence: int = 32, batch: int = 2) -> list[GradientCheck]:
    """Frozen base + LoRA + reentrant checkpointing, by hand and through ``transformers``.

    The reference is the un-checkpointed run. A hand-written reentrant wrapper around every
    block fails (the loss has no gradient path); around every other block it runs silently and
    the first block's adapters get none. The fixes: ``enable_input_require_grads()``, or
    ``use_reentrant=False``; and ``activation_checkpointing_enable`` does the first by itself.
    """
    base = model.get_base_model()
    ids = token_batch(batch, sequence, "cpu", base.config.vocab_size)
    blocks = decoder_blocks(model)
    reference, _, _ = _gradients(model, ids)

    def check(name: str, grads, caught, error) -> GradientCheck:
        missing = [n for n, g in grads.items() if g is None]
        present = [(g, reference[n]) for n, g in grads.items() if g is not None]
        difference = max((float((g - r).abs().max()) for g, r in present), default=None)
        return GradientCheck(name, missing, len(grads), difference, caught, error)

    checks = [check("no checkpointing (the reference)", reference, [], None)]
    cases: list[tuple[str, Callable[[], contextlib.AbstractContextManager]]] = [
        (
            "by hand, reentrant, every block",
            lambda: checkpointed_blocks(blocks, use_reentrant=True),
        ),
        (
            "by hand, reentrant, every other block",
            lambda: checkpointed_blocks(blocks[::2], use_reentrant=True),
        ),
        (
            "fix 1: by hand, reentrant, every block + enable_input_require_grads()",
            lambda: _with_input_require_grads(base, blocks),
        ),
        (
            "fix 2: by hand, use_reentrant=False, every block",
            lambda: checkpointed_blocks(blocks, use_reentrant=False),
        ),
        (
            "activation_checkpointing_enable(use_reentrant=True)",
            lambda: _through_transformers(base, use_reentrant=True),
        ),
    ]
    for name, setting in cases:
        with setting():
            checks.append(check(name, *_gradients(model, ids)))
    return checks


@contextlib.contextmanager
def _with_input_require_grads(base: PreTrainedModel, blocks: list[nn.Module]) -> Iterator[None]:
    base.enable_input_require_grads()
    try:
        with checkpointed_blocks(blocks, use_reentrant=True):
            yield
    finally:
        base.disable_input_require_grads()


@contextlib.contextmanager
def _through_transformers(base: PreTrainedModel, use_reentrant: bool) -> Iterator[None]:
    enable_checkpointing(base, {"use_reentrant": use_reentrant})
    try:
        yield
    finally:
        disable_checkpointing(base)


def pitfall_table(checks: Sequence[GradientCheck]) -> str:
    """Each run: trainable parameters without a gradient, and whether the rest match."""
    rows = []
    for c in checks:
        if c.error:
            verdict = f"no: backward failed ({c.error})"
        elif c.missing:
            verdict = f"no: {len(c.missing)} of {c.trainable} missing (first: {c.missing[0]})"
        else:
            verdict = f"yes (max |difference| {c.max_difference:.1e})"
        missing = "all" if c.error else f"{len(c.missing)}/{c.trainable}"
        rows.append((c.name, missing, verdict))
    return text_table(("run", "no grad", "gradients equal the reference"), rows, "lrl")


def checkpointing_messages(model: CausalLM, ids: torch.Tensor) -> list[str]:
    """What transformers and torch print when a checkpointed model is called with
    ``use_cache=True`` through the older name ``gradient_checkpointing_enable`` (deprecated in
    transformers 5.23)."""
    handler = _MessageCollector()
    messages = handler.messages
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    hf_logging = transformers.utils.logging
    hf_logging.disable_default_handler()  # collected here, not printed to stderr as well
    hf_logging.warning_once.cache_clear()  # shown once per process otherwise
    try:
        with warnings.catch_warnings(record=True) as records:
            warnings.simplefilter("always")
            model.gradient_checkpointing_enable()
            model(ids, use_cache=True)
    finally:
        logger.removeHandler(handler)
        hf_logging.enable_default_handler()
        disable_checkpointing(model)
    return [str(r.message) for r in records if r.category is FutureWarning] + messages


class _MessageCollector(logging.Handler):
    """A logging handler that keeps each record's message, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def default_use_reentrant(model: CausalLM) -> bool:
    """What ``activation_checkpointing_enable()`` with no arguments passes to ``checkpoint``."""
    enable_checkpointing(model)
    try:
        return decoder_blocks(model)[0]._gradient_checkpointing_func.keywords["use_reentrant"]
    finally:
        disable_checkpointing(model)


def versions() -> str:
    import peft

    return f"transformers {transformers.__version__}, peft {peft.__version__}"
