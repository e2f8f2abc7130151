"""Figures and widget panels, shared by the notebooks."""
