import torch
import torch.nn.functional as F

from tutorial_utils.measurement.flops import StepFlopCounter


def _attention_flops(query, key, value, enable_gqa: bool) -> int:
    counter = StepFlopCounter()
    with counter:
        F.scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=enable_gqa)
    return counter.result().total


def test_grouped_query_attention_counts_as_its_broadcast_heads():
    """On every torch the package supports (older FLOP formulas assert on unequal heads)."""
    query = torch.randn(2, 8, 16, 32)
    key, value = torch.randn(2, 2, 16, 32), torch.randn(2, 2, 16, 32)
    grouped = _attention_flops(query, key, value, enable_gqa=True)
    repeated = _attention_flops(
        query, key.repeat_interleave(4, dim=1), value.repeat_interleave(4, dim=1), enable_gqa=False
    )
    assert grouped == repeated > 0
