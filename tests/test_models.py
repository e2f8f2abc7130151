import pytest
import torch
import torch.nn as nn

from tests.article_code import ArticleNetA, article_vgg16
from tutorial_utils.articles.models import NetA, count_parameters, vgg16_classifier


def test_article_vgg16_matches_the_article_code_key_for_key_and_seed_for_seed():
    torch.manual_seed(0)
    theirs = article_vgg16()
    torch.manual_seed(0)
    ours = vgg16_classifier(layout="article")
    assert len(ours) == 10
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for name, tensor in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[name], tensor), name
    assert count_parameters(ours) == count_parameters(theirs)


def test_flat_vgg16_unrolls_the_features_with_the_same_weights_and_outputs():
    torch.manual_seed(0)
    article = vgg16_classifier(layout="article")
    torch.manual_seed(0)
    flat = vgg16_classifier(layout="flat")
    assert len(flat) == 40
    assert not any(getattr(m, "inplace", False) for m in flat.modules() if isinstance(m, nn.ReLU))
    assert count_parameters(flat) == count_parameters(article)
    x = torch.randn(2, 3, 32, 32)
    article.eval(), flat.eval()
    with torch.no_grad():
        assert torch.allclose(flat(x), article(x), atol=1e-5)


def test_unknown_vgg_layout_is_a_clear_error():
    with pytest.raises(ValueError, match="layout must be one of"):
        vgg16_classifier(layout="deep")


@pytest.mark.parametrize("use_checkpoint", [False, True])
def test_neta_state_dict_loads_strictly_into_the_article_code_and_gives_its_outputs(use_checkpoint):
    torch.manual_seed(0)
    ours = NetA(use_checkpoint=use_checkpoint)
    theirs = ArticleNetA(use_checkpoint=use_checkpoint)
    theirs.load_state_dict(ours.state_dict(), strict=True)
    ours.eval(), theirs.eval()
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(ours(x), theirs(x), atol=1e-6)


def test_neta_segment_selection():
    assert NetA(use_checkpoint=True).checkpointed_segments == frozenset(range(5))
    assert NetA(use_checkpoint=False).checkpointed_segments == frozenset()
    assert NetA(use_checkpoint={1, 3}).checkpointed_segments == frozenset({1, 3})
    with pytest.raises(ValueError, match="0..4"):
        _ = NetA(use_checkpoint={5}).checkpointed_segments
