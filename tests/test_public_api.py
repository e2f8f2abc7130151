"""The package top: every public name resolves, and IDEs see the same names as the lazy loader."""

from __future__ import annotations

import ast
import inspect
import typing
from collections.abc import Iterator

import pytest

import tutorial_utils


def test_every_name_in_all_resolves_to_the_object_of_its_module() -> None:
    for name in tutorial_utils.__all__:
        value = getattr(tutorial_utils, name)
        module = __import__(tutorial_utils._PUBLIC[name], fromlist=[name])
        assert value is getattr(module, name), name


def test_the_return_types_and_the_strategy_protocol_are_public() -> None:
    wanted = {"StepReport", "Plan", "PeakFloor", "MaxBatchResult", "Strategy", "StrategyKind"}
    wanted |= {"equal_segments", "every_nth_block", "selective", "offloaded", "scheduled"}
    parts = {
        "CudaReadings",
        "NvmlReading",
        "MpsReadings",
        "OptimizerFactory",
        "checkpointed_blocks",
    }
    assert wanted | parts <= set(tutorial_utils.__all__)
    gone = {"CheckpointStrategy", "Segments", "EqualSegments", "forward_segments", "sweep_segments"}
    assert not gone & set(tutorial_utils.__all__)


def _package_classes(annotation: object) -> Iterator[type]:
    """The package's classes named in an annotation, inside ``list[...]``, unions and the like."""
    if isinstance(annotation, type) and annotation.__module__.startswith("tutorial_utils."):
        yield annotation
    for argument in typing.get_args(annotation):
        yield from _package_classes(argument)


def _public_callables() -> Iterator[tuple[str, object]]:
    """Every exported function, and the public methods and properties of every exported class."""
    for name in tutorial_utils.__all__:
        value = getattr(tutorial_utils, name)
        if inspect.isfunction(value):
            yield name, value
        elif inspect.isclass(value):
            for member, function in inspect.getmembers(value, inspect.isfunction):
                if not member.startswith("_"):
                    yield f"{name}.{member}", function
            for member, prop in inspect.getmembers(value, lambda m: isinstance(m, property)):
                yield f"{name}.{member}", prop.fget


def test_every_class_a_public_function_returns_is_exported() -> None:
    exported = {getattr(tutorial_utils, name) for name in tutorial_utils.__all__}
    missing = {
        f"{where} -> {returned.__name__}"
        for where, function in _public_callables()
        for returned in _package_classes(typing.get_type_hints(function).get("return"))
        if returned not in exported
    }
    assert not missing, f"add these return types to tutorial_utils._PUBLIC: {sorted(missing)}"


def test_the_return_type_walk_sees_a_class_inside_a_container() -> None:
    """The walk looks inside ``list[...]`` and unions: a class returned there counts too."""
    hints = typing.get_type_hints(tutorial_utils.sweep_strategies)
    assert tutorial_utils.SweepRecord in set(_package_classes(hints["return"]))
    plan = typing.get_type_hints(tutorial_utils.plan_checkpoints)["return"]
    assert set(_package_classes(plan)) == {tutorial_utils.Plan, tutorial_utils.NestedPlan}


def test_type_checking_block_imports_exactly_the_lazy_names_from_their_modules() -> None:
    """The ``if TYPE_CHECKING:`` imports are what IDEs see: the same names, the same modules."""
    tree = ast.parse(inspect.getsource(tutorial_utils))
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
    )
    seen = {
        alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert seen == tutorial_utils._PUBLIC


def test_an_unknown_name_says_so() -> None:
    with pytest.raises(AttributeError, match="no_such_tool"):
        tutorial_utils.no_such_tool  # noqa: B018
