"""Shared pytest configuration."""

# Notebooks are collected by nbval from notebooks/ only; an .ipynb kept under tests/ is data.
collect_ignore_glob = ["*.ipynb"]
