"""Measuring a training step on any device: the tensor tracker, step and batch-size
measurement, dry runs on the meta device, FLOPs, NVML/CUDA readers, devices.
"""

__all__: list[str] = []
