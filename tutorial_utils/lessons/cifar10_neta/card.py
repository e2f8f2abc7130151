"""Notebook 03's card: the article's 2.5 GB budget, scaled to a profile or at 224 px by dry run."""

from __future__ import annotations

import torch

from tutorial_utils.articles.models import NetA, count_parameters
from tutorial_utils.articles.quoted import NETA_ARTICLE

ARTICLE_CARD_BYTES = NETA_ARTICLE.card_bytes
ARTICLE_IMAGE_SIZE = NETA_ARTICLE.image_size
ARTICLE_MAX_BATCH = NETA_ARTICLE.max_batch
SEGMENT_LAYERS = ("layer1", "layer2-3", "layer4-5", "layer6-7", "layer8 + pool + linear")
Batch = tuple[torch.Tensor, torch.Tensor]


def card_budget(image_size: int, card_bytes: int = ARTICLE_CARD_BYTES) -> int:
    """The article's card scaled to ``image_size``: the same room for weights, gradients and Adam
    state, the room for activations shrunk with the pixel count (activations scale with it)."""
    if image_size < 1:
        raise ValueError(f"image_size must be positive, got {image_size}")
    static = 4 * 4 * count_parameters(NetA())  # fp32 weights, gradients, Adam's two moments
    return int(static + (card_bytes - static) * (image_size / ARTICLE_IMAGE_SIZE) ** 2)
