"""Notebook 03's two panels: ``segments_panel`` and ``article_card`` (the rest is in its cells)."""

__all__: list[str] = []
