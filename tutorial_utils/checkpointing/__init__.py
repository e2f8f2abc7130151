"""The mechanisms: running a model with fewer activations kept (segments, selective
checkpointing, offloading) and the BatchNorm fixes recomputation needs. Imports nothing above.
"""

__all__: list[str] = []
