"""Training loops: the articles' epoch loop (with their log line and exact resume) and
distributed ranks (DDP/FSDP on gloo or NCCL).
"""

__all__: list[str] = []
