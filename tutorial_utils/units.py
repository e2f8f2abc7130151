"""Units shared by every layer: one definition of a megabyte.

Figures in this tutorial are MiB (2**20 bytes), written "MB" as PyTorch's and nvidia-smi's
figures usually are.
"""

MB = 2**20
