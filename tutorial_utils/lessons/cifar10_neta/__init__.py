"""Notebook 03's panels: ``segments_panel`` (which of NetA's segments to checkpoint, measured) and
``article_card`` (the article's card at 224 px by dry run, with a reserve slider). The notebook's
other code stands in its cells."""

__all__: list[str] = []
