"""Prose a learner reads at speed: scripts/prose_stats.py's targets for each notebook's core.

Every notebook is measured (so a broken parser shows everywhere); the targets hold for the
notebooks in ``READABLE``, which grows as each core is rewritten (issue 42).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from prose_stats import (  # noqa: E402
    MEAN_WORDS_MAX,
    SENTENCE_WORDS_MAX,
    prose_stats,
    sentences_of,
    word_count,
)

NOTEBOOKS = sorted((ROOT / "notebooks").glob("0*.ipynb"))
READABLE = {"01", "02", "03", "04", "05", "06", "07"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_each_core_reads_at_speed(path: Path) -> None:
    stats = prose_stats(path)
    assert stats.sentences, f"{path.name}: no prose found before '## Exercises'"
    if path.stem[:2] not in READABLE:
        pytest.skip(f"{path.stem}: prose targets not yet applied (READABLE)")
    long = [f"{word_count(s)} words: {s[:100]}" for s in stats.sentences
            if word_count(s) > SENTENCE_WORDS_MAX]  # fmt: skip
    assert not long, f"{path.name}: sentences over {SENTENCE_WORDS_MAX} words:\n" + "\n".join(long)
    assert stats.mean_words <= MEAN_WORDS_MAX, (
        f"{path.name}: {stats.mean_words:.1f} words a sentence"
    )


def test_the_counter_splits_sentences_and_ignores_code() -> None:
    text = "One idea here. `a very long code span counts once` Two!\n\n- an item\n"
    assert [word_count(s) for s in sentences_of(text)] == [3, 2, 2]
