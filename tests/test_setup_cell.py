"""The setup cell quiets peft's QLoRA preparation's FutureWarning about transformers' old method
name, and nothing else."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from tutorial_utils.lessons.setup import OLD_NAME_WARNING, report_environment

OLD_NAME_TEXT = "`gradient_checkpointing_enable` is deprecated and will be removed in v6."


def tiny_llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)  # fmt: skip
    model = LlamaForCausalLM(config)
    # what from_pretrained sets on a model loaded in 4 bits: peft then takes its QLoRA path
    # (bitsandbytes' real 4-bit load is in tests/test_qlora.py; it is not what is tested here)
    model.is_loaded_in_4bit = True
    return model


def warnings_of_qlora_preparation(after_setup_cell: bool) -> list[str]:
    from peft import prepare_model_for_kbit_training

    model = tiny_llama()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if after_setup_cell:
            report_environment("ci")
        prepare_model_for_kbit_training(model)  # use_gradient_checkpointing=True, as TRL calls it
    return [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]


def test_peft_s_qlora_preparation_warns_without_the_setup_cell_and_not_after_it(capsys) -> None:
    before = warnings_of_qlora_preparation(after_setup_cell=False)
    if not any(OLD_NAME_TEXT[:40] in message for message in before):
        pytest.skip("this transformers/peft pair does not warn: the filter has nothing to do")
    after = warnings_of_qlora_preparation(after_setup_cell=True)
    assert not any(OLD_NAME_TEXT[:40] in message for message in after), after


def test_the_filter_keeps_other_future_warnings_and_the_same_text_from_elsewhere(capsys) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report_environment("ci")
        for text, module in [
            (OLD_NAME_TEXT, "transformers.modeling_utils"),  # quieted
            (OLD_NAME_TEXT, "a_learner_s_module"),
            ("`from_pretrained` is deprecated", "transformers.modeling_utils"),
        ]:
            warnings.warn_explicit(text, FutureWarning, "x.py", 1, module=module)
    assert [(str(w.message), w.category) for w in caught] == [
        (OLD_NAME_TEXT, FutureWarning),
        ("`from_pretrained` is deprecated", FutureWarning),
    ]
    assert re.match(OLD_NAME_WARNING, OLD_NAME_TEXT)  # the filter's text is transformers' own
