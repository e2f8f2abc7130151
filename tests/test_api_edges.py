"""The public API at its edges: each misuse works or ends in one line that says what to do."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tutorial_utils import dry_run_step, find_max_batch_size, measure_step, plan_checkpoints
from tutorial_utils.checkpointing.strategy import equal_segments
from tutorial_utils.measurement.dry_run import model_for_sample
from tutorial_utils.measurement.meta_attention import DryRunCannotFollow
from tutorial_utils.measurement.step import sweep_strategies


def small_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)
    )


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message, message
    return message


# -- a model and a sample on different devices ---------------------------------------------------


def test_model_for_sample_copies_to_meta_for_a_meta_sample_and_leaves_the_model_alone() -> None:
    model = small_model()
    weights = [p.detach().clone() for p in model.parameters()]
    run = model_for_sample(model, torch.empty(4, 8, device="meta"))
    assert run is not model and all(p.device.type == "meta" for p in run.parameters())
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters(), strict=True))
    assert model_for_sample(model, torch.zeros(4, 8)) is model  # same device: itself


def test_model_for_sample_says_what_to_do_for_a_meta_model_and_a_real_sample() -> None:
    with torch.device("meta"):
        model = small_model()
    with pytest.raises(ValueError) as error:
        model_for_sample(model, torch.zeros(4, 8))
    assert "the model is on meta and the sample on cpu" in one_line(error)
    assert "device='meta'" in one_line(error)


def test_dry_run_step_runs_a_cpu_model_as_a_meta_copy() -> None:
    model = small_model()
    report = dry_run_step(model, (4, 8))
    assert report.dry_run and report.peak_bytes > 0
    assert all(p.device.type == "cpu" for p in model.parameters())


def test_measure_step_with_meta_inputs_and_a_cpu_model_points_to_dry_run_step() -> None:
    model = small_model()
    inputs = torch.empty(4, 8, device="meta")
    targets = torch.empty(4, dtype=torch.long, device="meta")
    with pytest.raises(ValueError) as error:
        measure_step(model, inputs, targets)
    assert "dry_run_step(model, (4, 8))" in one_line(error)
    with pytest.raises(ValueError, match="dry_run_step"):
        sweep_strategies(model, inputs, targets, [equal_segments(0), equal_segments(2)])
    assert all(p.device.type == "cpu" for p in model.parameters())  # untouched


def test_plan_checkpoints_dry_runs_a_cpu_model_on_a_meta_sample() -> None:
    model = small_model()
    plan = plan_checkpoints(model, torch.empty(4, 8, device="meta"))
    assert plan.measured_peak_bytes is not None
    assert all(p.device.type == "cpu" for p in model.parameters())


# -- a batch search whose budget fits no sample ----------------------------------------------------


def test_a_budget_below_one_sample_says_so() -> None:
    with pytest.raises(ValueError) as error:
        find_max_batch_size(small_model, (8,), 1024, num_classes=4, device="meta", max_batch=8)
    message = one_line(error)
    assert message.startswith("not even batch 1 fits the budget of 0.0 MiB")
    assert "raise the budget" in message


# -- a dry run that meets data-dependent code ------------------------------------------------------


class ReadsValues(nn.Module):
    """A layer whose forward decides by its input's values, as some real models do."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.how == "item":
            return h if h.mean().item() > 0 else -h
        if self.how == "tolist":
            return h * len([v for v in h.flatten().tolist() if v > 0])
        return h[h > 0].sum() + h  # a boolean mask: a shape that depends on values


@pytest.mark.parametrize("how", ["item", "tolist", "mask"])
def test_a_dry_run_of_data_dependent_code_says_to_measure_a_real_step(how: str) -> None:
    model = nn.Sequential(nn.Linear(8, 8), ReadsValues(how), nn.Linear(8, 4))
    with pytest.raises(DryRunCannotFollow) as error:
        dry_run_step(model, (4, 8))
    message = one_line(error)
    assert message.startswith("a dry run cannot follow code that reads tensor values")
    assert "measure a real step instead" in message
    # and the advice works: a real step of the same model at a small size
    report = measure_step(model, torch.randn(4, 8), torch.randint(0, 4, (4,)), time_step=False)
    assert report.peak_bytes > 0 and not report.dry_run


# -- the optimizer: a factory everywhere ---------------------------------------------------------


def test_an_optimizer_instance_is_refused_with_the_factory_to_pass() -> None:
    model = small_model()
    with pytest.raises(TypeError) as error:
        measure_step(
            model,
            torch.randn(4, 8),
            torch.randint(0, 4, (4,)),
            optimizer_factory=torch.optim.SGD(model.parameters(), lr=0.1),  # type: ignore[arg-type]
        )
    assert "optimizer_factory=lambda params:" in one_line(error)


def test_the_factory_gets_the_model_s_parameters_and_the_model_is_trained() -> None:
    model, made = small_model(), []

    def adam(parameters):
        made.append(torch.optim.Adam(parameters, lr=0.1))
        return made[-1]

    before = [p.detach().clone() for p in model.parameters()]
    measure_step(model, torch.randn(4, 8), torch.randint(0, 4, (4,)), optimizer_factory=adam)
    (optimizer,) = made
    assert [p for group in optimizer.param_groups for p in group["params"]] == list(
        model.parameters()
    )
    assert optimizer.state  # Adam's moments exist: the step was taken with the factory's optimizer
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
