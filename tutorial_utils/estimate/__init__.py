"""Your own model's training memory, before you rent the GPU: ``python -m tutorial_utils estimate``.

``models`` builds a causal LM (preset, config.json or model id) or a torchvision classifier on
the meta device, with LoRA if asked; ``strategies`` lists the ways people checkpoint (``checkpointing.strategy.Strategy``) and
parses the command's spellings of them;
``estimator`` dry-runs one step per strategy against a card (``card``) and searches the largest
size that fits, each step replayed through the emulated CUDA caching allocator; ``report`` prints
it; ``sharded`` says what each of N GPUs holds under FSDP2 or DDP. (The allocator's predictions
against a GPU's counters are a section of the GPU check: ``tutorial_utils.gpu_check.allocator``.)
"""
