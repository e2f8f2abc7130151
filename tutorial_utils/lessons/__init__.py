"""One module per notebook: the mechanics each notebook's cells call, tested in tests/."""

__all__: list[str] = []
