"""The articles' world: their profiles (sizes), data sets, models and experiment builders."""

__all__: list[str] = []
