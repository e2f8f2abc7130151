"""The table of strategy kinds: everything the package says about a kind of ``Strategy``, once.

Each row holds a kind's one-line meaning, whether it splits only an ``nn.Sequential``, its
families (how menus group it, how plots draw it), its command-line spellings and the constructor
that makes each, and what ``estimate`` runs by default. The command line's parsers and help, the
planner's families, the plots' styles and the estimate's default menu all read this table, so a
new kind is one row here, its branch in ``Strategy.applied``, and tests.

Torch-free on purpose: ``python -m tutorial_utils --help`` reads it before torch is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "STRATEGY_KINDS",
    "FamilyStyle",
    "KindRow",
    "default_spellings",
    "families",
    "kind_family",
    "spelled",
    "spellings",
    "strategy_spellings",
]


@dataclass(frozen=True)
class FamilyStyle:
    """A family of a menu, as tables group and plots draw it: its name, colour and marker."""

    name: str
    color: str
    marker: str


@dataclass(frozen=True)
class KindRow:
    """One kind of ``Strategy``.

    ``families``: the kind's own family first; a second is a variant that a Sequential's menu
    tells apart (sqrt(n) among equal segments, nested among plans). ``spellings``: the command
    line's words ("every-N": N a positive number; none: not on the command line).
    ``constructor``: the ``checkpointing.strategy`` function a spelling calls (with N, if it has
    one); "" calls ``Strategy(kind)``. ``default_spellings``: what ``estimate`` runs when
    ``--strategies`` is not given."""

    kind: str
    says: str
    families: tuple[FamilyStyle, ...]
    sequential_only: bool = False
    spellings: tuple[str, ...] = ()
    constructor: str = ""
    default_spellings: tuple[str, ...] = ()


# in menu order: menus, tables, legends and the command line's help list kinds in this order
STRATEGY_KINDS: dict[str, KindRow] = {
    row.kind: row
    for row in (
        KindRow(
            "none",
            "nothing checkpointed",
            (FamilyStyle("none", "black", "s"),),
            spellings=("none",),
            default_spellings=("none",),
        ),
        KindRow(
            "segments",
            "a Sequential in N equal segments, all but the last checkpointed",
            (FamilyStyle("uniform", "#8c8c8c", "o"), FamilyStyle("sqrt(n)", "#4c72b0", "D")),
            sequential_only=True,
            spellings=("segments-N",),
            constructor="equal_segments",
        ),
        KindRow(
            "every-n",
            "every (N-th) repeated block of any model checkpointed",
            (FamilyStyle("every n-th block", "#dd8452", "h"),),
            spellings=("every-block", "every-N"),
            constructor="every_nth_block",
            default_spellings=("every-block", "every-2"),
        ),
        KindRow(
            "plan",
            "a planner's schedule of a Sequential, one level or nested",
            (FamilyStyle("planned", "#c44e52", "*"), FamilyStyle("nested", "#937860", "P")),
            sequential_only=True,
        ),
        KindRow(
            "selective",
            "checkpointed regions keep the outputs of matmuls and convolutions, recompute the rest",
            (FamilyStyle("selective", "#55a868", "^"),),
            spellings=("selective",),
            constructor="selective",
            default_spellings=("selective",),
        ),
        KindRow(
            "compile-budget",
            "torch.compile's partition of a Sequential at a memory budget",
            (FamilyStyle("compile budget", "#da8bc3", "X"),),
            sequential_only=True,
        ),
        KindRow(
            "offload",
            "saved tensors wait in pinned host memory (GPU-only: listed, not measured in a dry run)",
            (FamilyStyle("offload", "#8172b3", "v"),),
            spellings=("offload",),
            constructor="offloaded",
            default_spellings=("offload",),
        ),
    )
}


def families() -> dict[str, FamilyStyle]:
    """Every family of every kind, in menu order: what tables group by and plots draw."""
    return {style.name: style for row in STRATEGY_KINDS.values() for style in row.families}


def kind_family(kind: str) -> str:
    """A kind's own family (the first of its row)."""
    return STRATEGY_KINDS[kind].families[0].name


def strategy_spellings(*, any_model: bool = False) -> str:
    """The command line's spellings, each with what it does, for a ``--help`` (``any_model``:
    only the kinds that checkpoint any model, not only a Sequential)."""
    return "; ".join(
        f"{' or '.join(row.spellings)}: {row.says}"
        for row in STRATEGY_KINDS.values()
        if row.spellings and not (any_model and row.sequential_only)
    )


def spellings(*, any_model: bool = False) -> tuple[str, ...]:
    """Every command-line word, in menu order (``any_model``: as ``strategy_spellings``)."""
    return tuple(
        word
        for row in STRATEGY_KINDS.values()
        if not (any_model and row.sequential_only)
        for word in row.spellings
    )


def spelled(text: str) -> tuple[KindRow, int | None]:
    """The row a command-line word spells, and its N (None for a word without one)."""
    word = text.strip().lower()
    for row in STRATEGY_KINDS.values():
        for spelling in row.spellings:
            if word == spelling:
                return row, None
            stem = spelling.removesuffix("N")
            if spelling.endswith("-N") and word.startswith(stem) and word[len(stem) :].isdigit():
                number = int(word[len(stem) :])
                if number >= 1:
                    return row, number
    raise ValueError(
        f"unknown strategy {text.strip()!r}: use one of {', '.join(spellings())} (N a number >= 1)"
    )


def default_spellings() -> tuple[str, ...]:
    """What ``estimate`` runs when ``--strategies`` is not given, in menu order."""
    return tuple(s for row in STRATEGY_KINDS.values() for s in row.default_spellings)
