"""Notebook 03's sizes per profile, beyond the profile's own image size, batch and sample counts."""

from __future__ import annotations

from dataclasses import dataclass

from tutorial_utils.articles.profiles import Profile


@dataclass(frozen=True)
class Sizes:
    """What notebook 03 runs besides the profile's training runs."""

    article_steps: int  # steps of the article's own training loop, checkpoint off and on


def sizes_for(profile: Profile) -> Sizes:
    """A few steps of the article's loop: enough to compare losses, short on a laptop."""
    steps = 2 if profile.name == "ci" else 4
    return Sizes(article_steps=profile.capped(steps) or steps)
