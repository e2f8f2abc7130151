"""Sequences that grow by one block at a time, written out at any number of blocks.

A dry run's ops and its allocation events, at k, k+p and k+2p identical blocks, differ by
chunks inserted in place: a block's forward, its backward, its gradients, its optimizer state.
``inserted`` finds the chunks (and the tokens that grow with each one: an op over every block's
tensors at once) and checks them on the third run; ``extend_log`` writes the events out at any
number of copies, each free pointing at its allocation by a rule fitted on the runs (the same
event of copy c + shift, or of the mirror copy in the backward pass, or a fixed base event).
Used by ``estimate.block_shortcut``; ``tests/test_block_shortcut.py`` holds the result to the
full dry run.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from tutorial_utils.measurement.allocator import AllocationEvent, AllocationLog

__all__ = ["Inserted", "extend_log", "inserted"]


# -- sequences that grow by inserted chunks --------------------------------------------------------


@dataclass
class Inserted:
    """A sequence with chunks inserted: ``base`` tokens, each chunk's base position and tokens,
    and the base tokens that grow with each insertion (an op over every block's tensors at
    once): ``tokens(copies)`` writes the sequence out with every chunk repeated in place."""

    base: list
    chunks: list[tuple[int, list]]
    growth: dict[int, tuple] = field(default_factory=dict)  # base index -> change per copy

    def tokens(self, copies: int) -> list:
        base = list(self.base)
        for index, change in self.growth.items():
            name, numbers = base[index]
            base[index] = (
                name,
                tuple(n + copies * d for n, d in zip(numbers, change, strict=True)),
            )
        out: list = []
        at = 0
        for position, tokens in self.chunks:
            out += base[at:position] + tokens * copies
            at = position
        return out + base[at:]

    def patterns(self, copies: int) -> list[tuple[int, int, int]]:
        """(chunk, offset, copy) of each token (chunk -1: base; offset: the base index)."""
        out = []
        at = 0
        for chunk, (position, tokens) in enumerate(self.chunks):
            out += [(-1, i, 0) for i in range(at, position)]
            out += [(chunk, o, c) for c in range(copies) for o in range(len(tokens))]
            at = position
        return out + [(-1, i, 0) for i in range(at, len(self.base))]


def inserted(runs: list[list]) -> Inserted | None:
    """The chunks that turn the first run into the second, when the third is the first with
    each chunk twice; None otherwise. Tokens are (name, numbers): names must match; a base
    token's numbers may grow by the same step with each insertion.

    The alignment of the first two runs can be ambiguous: one block's allocations of a
    ``foreach`` op and the frees that follow them form a single inserted stretch at the border
    between the two, where each copy must go into its own half. Where the first alignment fails
    the third run, a stretch that cannot slide is tried as two, split at each place."""
    first, second, third = runs
    names = [[token[0] for token in run] for run in (first, second)]
    matcher = difflib.SequenceMatcher(None, names[0], names[1], autojunk=False)
    places = []  # (base position, start in the second run, length)
    for tag, i1, _i2, j1, j2 in matcher.get_opcodes():
        if tag == "insert":
            places.append((i1, j1, j2 - j1))
        elif tag != "equal":
            return None
    found = _checked(first, second, third, _slid(places, names))
    if found is not None:
        return found
    for index, (at, start, length) in enumerate(places):
        if _slid([(at, start, length)], names) != [(at, start, length)]:
            continue  # it slides: not stuck at a border
        for split in range(1, length):
            parts = [(at, start, split), (at, start + split, length - split)]
            tried = _slid([*places[:index], *parts, *places[index + 1 :]], names)
            found = _checked(first, second, third, tried)
            if found is not None:
                return found
    return None


def _slid(places: list[tuple[int, int, int]], names: list[list]) -> list[tuple[int, int, int]]:
    """Each insertion moved to the middle of the stretch it could equally sit in (between two
    middle blocks, not next to an end)."""
    moved = []
    for index, (at, start, length) in enumerate(places):
        low = places[index - 1][0] if index else 0
        high = places[index + 1][0] if index + 1 < len(places) else len(names[0])
        early = late = (at, start)
        while early[0] > low and names[0][early[0] - 1] == names[1][early[1] + length - 1]:
            early = (early[0] - 1, early[1] - 1)
        while late[0] < high and names[0][late[0]] == names[1][late[1]]:
            late = (late[0] + 1, late[1] + 1)
        middle = (late[0] - early[0]) // length // 2 * length
        moved.append((early[0] + middle, early[1] + middle, length))
    return moved


def _checked(
    first: list, second: list, third: list, places: list[tuple[int, int, int]]
) -> Inserted | None:
    """The insertions ``places`` as an ``Inserted``, if the third run is the first with each
    chunk twice; else None."""
    chunks = [(i, second[j : j + length]) for i, j, length in places]
    growth = {}
    shift = 0
    for i, token in enumerate(first):
        shift += sum(length for at, _, length in places if at == i)
        if i + shift >= len(second):
            return None
        if token != second[i + shift]:
            if token[0] != second[i + shift][0]:
                return None
            growth[i] = tuple(b - a for a, b in zip(token[1], second[i + shift][1], strict=True))
    found = Inserted(first, chunks, growth)
    return found if found.tokens(2) == third else None


# -- the allocation events ------------------------------------------------------------------------


def _tokens(log: AllocationLog) -> tuple[list[tuple], list[int | None]]:
    """Each event as (kind, bytes), and for a free the position of the allocation it frees."""
    sizes: dict[int, int] = {}
    where: dict[int, int] = {}
    tokens: list[tuple] = []
    refs: list[int | None] = []
    for position, event in enumerate(log.events):
        if event.kind == "malloc":
            sizes[event.key], where[event.key] = event.nbytes, position
            tokens.append((("m", event.nbytes), ()))
            refs.append(None)
        elif event.kind == "free":
            tokens.append((("f", sizes[event.key]), ()))
            refs.append(where.pop(event.key))
        else:
            tokens.append((("w", event.key), ()))
            refs.append(None)
    return tokens, refs


Reference = tuple  # ("line", a, b) | ("const", base index) | (rule, shift, chunk, offset)


def _position(found: Inserted, copies: int, chunk: int, offset: int, copy: int) -> int | None:
    """Where event ``offset`` of copy ``copy`` of ``chunk`` sits in the run with ``copies``
    copies; a copy outside 0..copies-1 is the same event of the identical blocks of the base
    before (negative) or after the chunk."""
    before = sum(len(tokens) for _, tokens in found.chunks[:chunk]) * copies
    at, tokens = found.chunks[chunk]
    if 0 <= copy < copies:
        return at + before + copy * len(tokens) + offset
    index = at + (copy if copy < 0 else copy - copies) * len(tokens) + offset
    if not 0 <= index < len(found.base):
        return None
    return index + _shift(found, index, copies)


def _shift(found: Inserted, index: int, copies: int) -> int:
    """How far base event ``index`` moves in the run with ``copies`` copies."""
    return sum(len(tokens) for at, tokens in found.chunks if at <= index) * copies


def _references(found: Inserted, refs: list[list[int | None]]) -> dict[tuple, Reference] | None:
    """What each free frees. A base free: a position on a line in the copies, fitted through
    the runs with one and two copies (with none, it may free a base event that a copy stands in
    for later). A chunk's free: a fixed base event, or the same event of copy c + shift
    ("shift") or n - 1 - c + shift ("mirror", the backward pass's order) of some chunk."""
    seen: dict[tuple[int, int], dict[tuple[int, int], int]] = {}
    for copies, run in enumerate(refs):
        for (chunk, offset, copy), ref in zip(found.patterns(copies), run, strict=True):
            if ref is not None:
                seen.setdefault((chunk, offset), {})[copies, copy] = ref
    references: dict[tuple, Reference] = {}
    for pattern, at in seen.items():
        if pattern[0] == -1:
            b = at[2, 0] - at[1, 0]
            references[pattern] = ("line", at[1, 0] - b, b)
            continue
        cases = {key: ref for key, ref in at.items() if key[0]}
        fitted = _fit_chunk_free(found, cases)
        if fitted is None:
            return None
        references[pattern] = fitted
    return references


def _fit_chunk_free(found: Inserted, cases: dict[tuple[int, int], int]) -> Reference | None:
    """The first reference of a chunk's free that explains every (copies, copy) -> position:
    candidates come from inverting one case, each is checked on all of them."""
    base_refs = {ref - _shift(found, ref, 0) for ref in cases.values()}
    candidates: list[Reference] = []
    if len(set(cases.values())) == 1 or len(base_refs) == 1:
        candidates.append(("const", next(iter(base_refs))))
    (n, c), ref = max(cases.items())
    for chunk in range(len(found.chunks)):
        virtual = _virtual(found, n, chunk, ref)
        if virtual is not None:
            offset, copy = virtual
            candidates += [
                ("shift", copy - c, chunk, offset),
                ("mirror", copy - (n - 1 - c), chunk, offset),
            ]
    for candidate in candidates:
        if all(_target(found, candidate, c, n) == r for (n, c), r in cases.items()):
            return candidate
    return None


def _virtual(found: Inserted, copies: int, chunk: int, position: int) -> tuple[int, int] | None:
    """(offset, copy) of ``position`` as an event of ``chunk``'s copies in the run with
    ``copies`` copies, the base's identical blocks before and after the chunk counted as copies
    -1, -2... and copies, copies + 1... (the inverse of ``_position``)."""
    at, tokens = found.chunks[chunk]
    length = len(tokens)
    start = at + sum(len(t) for _, t in found.chunks[:chunk]) * copies
    if start <= position < start + length * copies:
        return (position - start) % length, (position - start) // length
    base = _base_index(found, copies, position)
    if base is None:
        return None
    delta = base - at
    return delta % length, delta // length + (copies if delta >= 0 else 0)


def _base_index(found: Inserted, copies: int, position: int) -> int | None:
    """The base index of the event at ``position`` in the run with ``copies`` copies (None:
    inside a chunk's copies)."""
    moved = 0
    for at, tokens in found.chunks:
        if position < at + moved:
            return position - moved
        if position < at + moved + len(tokens) * copies:
            return None
        moved += len(tokens) * copies
    return position - moved


def _target(found: Inserted, reference: Reference, copy: int, copies: int) -> int | None:
    """The position, in the run with ``copies`` copies, of what a free frees."""
    if reference[0] == "line":
        return reference[1] + reference[2] * copies
    if reference[0] == "const":
        return reference[1] + _shift(found, reference[1], copies)
    rule, shift, chunk, offset = reference
    target = copy + shift if rule == "shift" else copies - 1 - copy + shift
    return _position(found, copies, chunk, offset, target)


def extend_log(logs: list[AllocationLog], copies: int) -> AllocationLog | None:
    """The events of the step with ``copies`` insertions, from its events with 0, 1 and 2
    (``shortcut_outcome``); None where they do not follow one pattern."""
    tokens, refs = zip(*map(_tokens, logs), strict=True)
    found = inserted(list(tokens))
    if found is None:
        return None
    references = _references(found, list(refs))
    if references is None:
        return None
    patterns = found.patterns(copies)
    events: list[AllocationEvent] = []
    freed: set[int] = set()
    all_tokens = found.tokens(copies)
    for index, ((chunk, offset, copy), ((kind, value), _)) in enumerate(
        zip(patterns, all_tokens, strict=True)
    ):
        if kind == "m":
            events.append(AllocationEvent("malloc", index, value))
        elif kind == "w":
            events.append(AllocationEvent("workspace", value))
        else:
            ref = _target(found, references[chunk, offset], copy, copies)
            if ref is None or not 0 <= ref < index or ref in freed:
                return None
            if all_tokens[ref] != (("m", value), ()):
                return None
            freed.add(ref)
            events.append(AllocationEvent("free", ref))
    first, second = logs[0].baseline_events, logs[1].baseline_events
    if logs[2].baseline_events - second != second - first:
        return None
    return AllocationLog(events, first + copies * (second - first))
