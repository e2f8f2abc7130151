"""Helpers for the gradient-checkpointing tutorial notebooks."""
