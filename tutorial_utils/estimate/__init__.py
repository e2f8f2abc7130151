"""Your own model's training memory, before you rent the GPU: ``python -m tutorial_utils estimate``.

``workload`` says what is trained and how; ``models`` builds a causal LM (preset, config.json or
model id) or a torchvision classifier on the meta device, with LoRA if asked (``qlora``: a 4-bit
base, cast as peft or TRL cast it); ``building`` makes a workload's model, optimizer, batch and
loss; ``strategies`` lists the ways people checkpoint
(``checkpointing.strategy.Strategy``) and parses the command's spellings of them; ``estimator``
dry-runs one step per strategy against a card (``card``: the GPUs' facts, with sources) and
searches the largest size that fits, each step replayed through the emulated CUDA caching
allocator; ``breakdown`` splits a language model's kept activations by region; ``report`` prints
it, ``record`` gives every figure as data (``--json``), ``snapshot`` writes the replayed step as a
CUDA memory snapshot (``--snapshot``); ``sharded`` says what each of N GPUs holds under FSDP2 or
DDP, mixed precision included (``estimator.estimate(..., sharding=...)``: the same pipeline). (The allocator's predictions against a GPU's counters are a section of the GPU check:
``tutorial_utils.gpu_check.allocator``.)
"""

__all__: list[str] = []  # the modules are the public surface: import from them
