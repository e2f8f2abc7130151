"""The GPU check behind ``scripts/gpu_check.py``: what only runs on CUDA, section by section.

``report`` holds the results and renders the markdown report; ``runner`` runs the sections under
one time budget, each isolated; every other module is one section and exports its ``SECTION``:
``hardware``, ``crosscheck``, ``batch_search``, ``offloading``, ``nccl``, ``estimate``,
``allocator``, ``kernels``, ``notebooks``. Each section's CPU side (its rows judged, its table
rendered) is tested in ``tests/test_gpu_check.py`` with made-up figures.
"""

__all__: list[str] = []
