"""What the installed ``transformers`` says and does: the ``use_cache`` warning, the deprecated
name, the default ``use_reentrant``, the versions. (The LoRA + reentrant pitfall is the
notebook's own loop, in a copy cell.)"""

from __future__ import annotations

import logging
import warnings

import torch
import transformers

from tutorial_utils.checkpointing.transformers_api import (
    disable_checkpointing,
    enable_checkpointing,
)
from tutorial_utils.estimate.models import (
    decoder_blocks,
)
from tutorial_utils.lessons.checkpointing_a_transformer.models import (
    CausalLM,
)

__all__ = ["checkpointing_messages", "default_use_reentrant", "versions"]


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
