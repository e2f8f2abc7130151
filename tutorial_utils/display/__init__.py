"""Figures and widget panels, shared by the notebooks."""

__all__: list[str] = []
