"""Shared pytest configuration."""

# Notebooks are collected by nbval from notebooks/ only; an .ipynb kept under tests/ is data.
collect_ignore_glob = ["*.ipynb"]


def pytest_collection_modifyitems(items: list) -> None:
    """The browser test first: it is the suite's longest single run (every notebook, one after
    the other, on one pytest-xdist worker), so starting it first lets the other worker take the
    unit tests beside it instead of after it (``./scripts/test`` keeps this order with
    ``--no-loadscope-reorder``)."""
    items.sort(key=lambda item: item.get_closest_marker("browser") is None)
