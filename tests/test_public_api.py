"""The package top: every public name resolves, and IDEs see the same names as the lazy loader."""

from __future__ import annotations

import ast
import inspect

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
    assert wanted <= set(tutorial_utils.__all__)
    gone = {"CheckpointStrategy", "Segments", "EqualSegments", "forward_segments", "sweep_segments"}
    assert not gone & set(tutorial_utils.__all__)


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
