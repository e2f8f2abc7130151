"""Sentence lengths of each notebook's core, so prose stays readable at speed.

The core is every markdown cell before "## Exercises". A sentence is split at ".", "!" or "?"
followed by a space and a capital, a backtick or a digit, and at the end of each paragraph, list
item, heading and table row; code (fenced or inline) counts as one word, link targets, HTML
comments and math as none. The targets (issue 42): at most 20 words a sentence on average and
none over 40.

Usage: python scripts/prose_stats.py [--check] [notebooks...]   (default: notebooks/*.ipynb)
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
MEAN_WORDS_MAX = 20.0
SENTENCE_WORDS_MAX = 40
CORE_END = "## Exercises"

FENCED = re.compile(r"```.*?```", re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
HTML_TAG = re.compile(r"<[^>]+>")
INLINE_CODE = re.compile(r"`[^`]*`")
MATH = re.compile(r"\$\$.*?\$\$|\$[^$\n]*\$", re.S)
LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
URL = re.compile(r"https?://\S+")
ABBREVIATIONS = re.compile(r"\b(e\.g|i\.e|vs|etc|cf|approx|Fig|No)\.", re.I)
SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[A-Z`\d(*_\"])")
BLOCK_START = re.compile(r"^\s*(?:[-*+]\s|\d+\.\s|#+\s|\|)")
CODE_WORD = "CODE"


class ProseStats(NamedTuple):
    """One notebook core's sentences and their lengths in words."""

    sentences: list[str]
    mean_words: float
    max_words: int


def core_markdown(notebook_path: Path) -> list[str]:
    """The sources of the markdown cells before the exercises."""
    cells = json.loads(notebook_path.read_text(encoding="utf-8"))["cells"]
    sources = []
    for cell in cells:
        source = "".join(cell["source"])
        if source.startswith(CORE_END):
            break
        if cell["cell_type"] == "markdown":
            sources.append(source)
    return sources


def sentences_of(markdown: str) -> list[str]:
    """Split prose into sentences; blocks (paragraphs, items, rows) always end one."""
    text = FENCED.sub(f" {CODE_WORD} ", markdown)
    text = COMMENT.sub(" ", text)
    text = MATH.sub(" ", text)
    text = INLINE_CODE.sub(CODE_WORD, text)
    text = LINK.sub(r"\1", text)
    text = URL.sub(" ", text)
    text = HTML_TAG.sub(" ", text)
    text = ABBREVIATIONS.sub(lambda match: match.group(0).replace(".", ""), text)
    blocks: list[str] = []
    for line in text.splitlines():
        if not line.strip() or BLOCK_START.match(line) or line.lstrip().startswith(">"):
            blocks.append(line)
        elif blocks and blocks[-1].strip() and not blocks[-1].lstrip().startswith(("#", "|")):
            blocks[-1] += " " + line
        else:
            blocks.append(line)
    found = []
    for block in blocks:
        block = re.sub(r"^\s*(?:[-*+>]\s|\d+\.\s|#+\s)", "", block).strip(" |")
        found.extend(part.strip() for part in SENTENCE_END.split(block) if part.split())
    return found


def word_count(sentence: str) -> int:
    return len([word for word in sentence.split() if re.search(r"\w", word)])


def prose_stats(notebook_path: Path) -> ProseStats:
    """The core's sentences, their mean length and the longest, in words."""
    sentences = [s for source in core_markdown(notebook_path) for s in sentences_of(source)]
    counts = [word_count(sentence) for sentence in sentences] or [0]
    return ProseStats(sentences, statistics.fmean(counts), max(counts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--check", action="store_true", help="exit 1 when a core is over target")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    over = False
    for path in paths:
        stats = prose_stats(path)
        long = [s for s in stats.sentences if word_count(s) > SENTENCE_WORDS_MAX]
        verdict = "ok"
        if stats.mean_words > MEAN_WORDS_MAX or long:
            verdict, over = "over target", True
        print(
            f"{path.stem}: {len(stats.sentences)} sentences, {stats.mean_words:.1f} words on "
            f"average (target <= {MEAN_WORDS_MAX:.0f}), longest {stats.max_words} "
            f"(target <= {SENTENCE_WORDS_MAX}): {verdict}"
        )
        for sentence in long:
            print(f"  {word_count(sentence)} words: {sentence[:160]}")
    return 1 if args.check and over else 0


if __name__ == "__main__":
    sys.exit(main())
