"""Choosing what to checkpoint: the cost-model planner, the strategy menus, and the floor
no plan can beat.
"""

__all__: list[str] = []
