"""How to checkpoint any model, as one value: ``Strategy``, and ``strategy.applied(model)``.

Every step, sweep, batch search, training loop, planner menu and estimate takes a ``Strategy``
(None: no checkpointing). Inside ``with strategy.applied(model):`` a plain ``model(x)`` runs
checkpointed that way; on exit the model is as before. An ``nn.Sequential`` is run through a
schedule of its modules (equal segments as ``checkpoint_sequential`` splits them, a planner's
plan, torch.compile's partition, selective regions, offloading); any other model by its repeated
blocks (``blocks.repeated_blocks``) wrapped in ``checkpoint``, or, for a ``transformers`` model,
through its own call (``transformers_api.enable_checkpointing``).

BatchNorm: a checkpointed segment's recomputation would update the running statistics a second
time; ``keep_batchnorm=True`` (the default) leaves them alone there (``batchnorm``), and
``keep_batchnorm=False`` is plain ``checkpoint_sequential``, which notebooks 02 and 03 show
double-updating them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast, runtime_checkable

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from tutorial_utils.checkpointing.batchnorm import run_keeping_batchnorm
from tutorial_utils.checkpointing.blocks import checkpointed_blocks, repeated_blocks
from tutorial_utils.checkpointing.kinds import STRATEGY_KINDS, spelled
from tutorial_utils.checkpointing.segments import segment_boundaries, validate_segments
from tutorial_utils.checkpointing.selective import (
    EXPENSIVE_OPS,
    sac_hooks_option,
    selective_context_fn,
)
from tutorial_utils.checkpointing.transformers_api import (
    disable_checkpointing,
    enable_checkpointing,
)

__all__ = [
    "ContextFn",
    "ContextWrapper",
    "equal_segments",
    "every_nth_block",
    "NO_CHECKPOINTING",
    "OFFLOAD_NOTE",
    "offloaded",
    "parse_strategy",
    "scheduled",
    "selective",
    "SequentialSchedule",
    "Strategy",
    "StrategyKind",
]

# the kinds' names, for type checkers; what each kind is, and everything said about it, is its
# row in ``kinds.STRATEGY_KINDS``, which a test holds equal to this list
StrategyKind = Literal[
    "none", "segments", "every-n", "plan", "selective", "compile-budget", "offload"
]

# what wraps a checkpoint's ``context_fn`` (None: the default contexts), e.g. an emulated
# autocast's ``checkpoint_context_fn``, so that recomputation re-enters it
ContextFn = Callable[[], tuple]
ContextWrapper = Callable[[ContextFn | None], ContextFn]

OFFLOAD_NOTE = "GPU-only: keeps checkpoints in pinned host memory; not measurable without CUDA"


@runtime_checkable
class SequentialSchedule(Protocol):
    """How a Sequential's forward runs: a planner's ``Plan``/``NestedPlan``, ``CompileBudget``."""

    def forward(
        self, model: nn.Sequential, x: torch.Tensor, use_reentrant: bool, preserve_rng_state: bool
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class Strategy:
    """One way to checkpoint a model: ``kind`` and the settings it reads.

    ``segments``: the count of equal segments of a Sequential (on "none", the 0 or 1
    ``equal_segments`` was given). ``regions``: the equal regions "selective" checkpoints on a
    Sequential (0 on other models).
    ``every``: every n-th repeated block for "every-n", "selective" and "offload" on other models.
    ``saved_ops``: what "selective" keeps. ``schedule``: what "plan"/"compile-budget" run.
    ``predicted``: the planner's forecast, carried for its tables. ``name``: the label tables show.
    """

    kind: StrategyKind
    name: str = ""
    segments: int = 0
    regions: int = 0
    every: int = 1
    saved_ops: frozenset = field(default_factory=frozenset)
    schedule: SequentialSchedule | None = None
    use_reentrant: bool = False
    preserve_rng_state: bool = True
    keep_batchnorm: bool = True
    predicted: object | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in STRATEGY_KINDS:
            raise ValueError(
                f"unknown strategy kind {self.kind!r}: choose one of {', '.join(STRATEGY_KINDS)}"
            )
        for setting in ("segments", "regions"):
            value = getattr(self, setting)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{setting} must be an integer, 0 or more, got {value!r}")
        if self.kind == "segments" and self.segments < 2:
            raise ValueError(
                f"segments={self.segments} checkpoints nothing: use 2 or more, or NO_CHECKPOINTING"
            )
        if self.segments > 1 and self.kind != "segments":
            raise ValueError(f"segments={self.segments} is for kind 'segments', not {self.kind!r}")
        if self.regions and self.kind != "selective":
            raise ValueError(f"regions are for selective checkpointing, not {self.kind!r}")
        if self.every < 1:
            raise ValueError(f"every must be at least 1 (every block), got {self.every}")
        if self.saved_ops and self.kind != "selective":
            raise ValueError(f"saved_ops is for selective checkpointing, not {self.kind!r}")
        if self.kind == "selective" and not self.saved_ops:
            raise ValueError("selective needs saved_ops: pass e.g. selective(MATRIX_PRODUCT_OPS)")
        if self.kind == "selective" and self.use_reentrant:
            raise ValueError("selective checkpointing needs use_reentrant=False")
        if (self.kind in ("plan", "compile-budget")) != (self.schedule is not None):
            raise ValueError(
                f"a {self.kind!r} strategy {'needs' if self.schedule is None else 'takes no'} "
                "schedule: use scheduled(plan) for a planner's plan or CompileBudget"
            )
        if not self.name:
            object.__setattr__(self, "name", self._default_name())

    def _default_name(self) -> str:
        blocks = "every block" if self.every == 1 else f"every {_ordinal(self.every)} block"
        if self.kind == "segments":
            return f"{self.segments} segments"
        if self.kind == "every-n":
            return blocks
        if self.kind == "selective":
            what = "matmuls+convs" if self.saved_ops == EXPENSIVE_OPS else "chosen ops"
            regions = f", {self.regions} regions" if self.regions else ""
            return f"selective: {what}{regions}"
        if self.kind == "offload":
            return f"{blocks}, offloaded"
        if self.schedule is not None:
            return str(self.schedule)
        return self.kind

    def __str__(self) -> str:
        return self.name

    def __reduce__(self) -> tuple:
        """Pickled with its ops by name (``aten.mm.default``): an op itself does not pickle, and
        the estimator's forked workers send strategies and reports back and forth."""
        settings = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        settings["saved_ops"] = tuple(sorted(str(op) for op in self.saved_ops))
        return (_unpickled, (settings,))

    @property
    def gpu_only(self) -> bool:
        """Offloading: on a CPU or in a dry run the saved tensors are in host memory already."""
        return self.kind == "offload"

    def check(self, model: nn.Module) -> None:
        """A clear ``ValueError`` when this strategy cannot checkpoint ``model``."""
        if STRATEGY_KINDS[self.kind].sequential_only and not isinstance(model, nn.Sequential):
            raise ValueError(
                f"{self.name!r} splits an nn.Sequential; {type(model).__name__} is not one: use "
                "every_nth_block(n), selective(...) or offloaded(), or NO_CHECKPOINTING for a "
                "model that checkpoints itself (e.g. NetA(use_checkpoint=True))"
            )
        if not isinstance(model, nn.Sequential) or self.kind not in ("segments", "selective"):
            return
        if self.kind == "selective" and self.regions < 1:
            raise ValueError(
                f"selective checkpointing of an nn.Sequential runs in regions: pass "
                f"selective(ops, regions=k) with k in 1..{len(model)}"
            )
        validate_segments(model, self._runs)

    @property
    def _runs(self) -> int:
        """How many equal runs a Sequential is split into: segments, or selective's regions."""
        return self.regions if self.kind == "selective" else self.segments

    def checkpoint_kwargs(self, wrap_context: ContextWrapper | None = None) -> dict[str, Any]:
        """What goes to ``torch.utils.checkpoint.checkpoint`` for this strategy."""
        kwargs: dict[str, Any] = {
            "use_reentrant": self.use_reentrant,
            "preserve_rng_state": self.preserve_rng_state,
        }
        inner = selective_context_fn(self.saved_ops) if self.kind == "selective" else None
        context_fn = wrap_context(inner) if wrap_context is not None else inner
        if context_fn is not None:
            kwargs["context_fn"] = context_fn
            kwargs.update(sac_hooks_option())
        return kwargs

    def run(self, model: nn.Module, *args: Any, **kwargs: Any) -> Any:
        """``model(*args, **kwargs)`` checkpointed this way: one call inside ``applied``."""
        with self.applied(model):
            return model(*args, **kwargs)

    @contextlib.contextmanager
    def applied(
        self, model: nn.Module, wrap_context: ContextWrapper | None = None
    ) -> Iterator[nn.Module]:
        """Inside the ``with``, ``model(x)`` runs checkpointed this way; as before on exit.

        ``wrap_context`` wraps each checkpoint's ``context_fn`` (an emulated autocast's
        ``checkpoint_context_fn`` in a dry run under mixed precision, so that recomputation
        re-enters it; a real device re-enters its own autocast)."""
        self.check(model)
        parameter = next(model.parameters(), None)
        device_type = parameter.device.type if parameter is not None else "cpu"
        if self.gpu_only and device_type != "cuda":
            raise ValueError(f"{self.name!r} is {OFFLOAD_NOTE}: run it on CUDA")
        base: Any = cast(Any, model).get_base_model() if hasattr(model, "get_base_model") else model
        if hasattr(base, "supports_gradient_checkpointing"):  # a transformers model
            with self._transformers_applied(base, wrap_context):
                yield model
        elif self.kind == "none":
            yield model
        elif isinstance(model, nn.Sequential) and self.kind != "every-n":
            with _forward_replaced(
                model, functools.partial(self._sequential_forward, model, wrap_context)
            ):
                yield model
        else:
            kwargs = self.checkpoint_kwargs(wrap_context)
            blocks = repeated_blocks(model)[:: self.every]
            if not blocks:
                raise ValueError(
                    f"{type(model).__name__} has no repeated blocks (modules with parts of their "
                    f"own inside an nn.Sequential) for {self.name!r}: split a flat nn.Sequential "
                    "with equal_segments(k)"
                )
            with checkpointed_blocks(
                blocks,
                use_reentrant=self.use_reentrant,
                context_fn=kwargs.get("context_fn"),
                offload=self.gpu_only,
            ):
                yield model

    @contextlib.contextmanager
    def _transformers_applied(
        self, base: nn.Module, wrap_context: ContextWrapper | None
    ) -> Iterator[None]:
        """The model's own call; switched off first, so that "none" keeps no input hook."""
        disable_checkpointing(base)
        if self.kind == "none":
            yield
            return
        if STRATEGY_KINDS[self.kind].sequential_only:
            raise ValueError(f"{self.name!r} needs an nn.Sequential, not a transformers model")
        kwargs = self.checkpoint_kwargs(wrap_context)
        kwargs.pop("preserve_rng_state")
        enable_checkpointing(base, kwargs, every_n_layers=self.every, offload=self.gpu_only)
        try:
            yield
        finally:
            disable_checkpointing(base)

    def _sequential_forward(
        self, model: nn.Sequential, wrap_context: ContextWrapper | None, x: torch.Tensor
    ) -> torch.Tensor:
        """A Sequential's forward under this strategy (the model's own forward is back meanwhile,
        so a schedule that calls ``model(x)``, as torch.compile's trace does, gets the plain one)."""
        if self.schedule is not None:
            return self.schedule.forward(model, x, self.use_reentrant, self.preserve_rng_state)
        if self.kind == "offload":  # nothing recomputed: every saved tensor waits on the host
            with torch.autograd.graph.save_on_cpu(pin_memory=True):
                return model(x)
        kwargs = self.checkpoint_kwargs(wrap_context)
        run_modules = run_keeping_batchnorm if self.keep_batchnorm else _run_modules
        modules = list(model)
        runs = segment_boundaries(len(modules), self._runs)
        for index, (start, end) in enumerate(runs):
            run = functools.partial(run_modules, modules[start:end])
            if self.kind == "segments" and index == len(runs) - 1:
                x = run(x)  # checkpoint_sequential's last segment: never recomputed
            else:
                x = checkpoint(run, x, **kwargs)
        return x


@contextlib.contextmanager
def _forward_replaced(
    model: nn.Module, forward: Callable[[torch.Tensor], torch.Tensor]
) -> Iterator[None]:
    """``model(x)`` calls ``forward(x)`` inside the ``with``; the class's forward during it."""

    def replaced(x: torch.Tensor) -> torch.Tensor:
        del model.forward  # the class's forward, for schedules that call model(x)
        try:
            return forward(x)
        finally:
            model.forward = replaced

    model.forward = replaced
    try:
        yield
    finally:
        model.__dict__.pop("forward", None)


def _unpickled(settings: dict[str, Any]) -> Strategy:
    ops = (functools.reduce(getattr, name.split("."), torch.ops) for name in settings["saved_ops"])
    return Strategy(**{**settings, "saved_ops": frozenset(ops)})


def _run_modules(modules: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    for module in modules:
        x = module(x)
    return x


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


# -- constructors: how call sites spell a strategy ---------------------------------------------

NO_CHECKPOINTING = Strategy("none")


def equal_segments(count: int, *, keep_batchnorm: bool = True, **options: Any) -> Strategy:
    """``checkpoint_sequential(model, count, x)``'s split; 0 or 1 checkpoints nothing (as there).
    ``keep_batchnorm=False`` is exactly ``checkpoint_sequential`` (BatchNorm updated twice)."""
    if count in (0, 1) and not isinstance(count, bool):
        name = f"{count} segment{'' if count == 1 else 's'}"
        return Strategy("none", name=name, segments=count, **options)
    return Strategy("segments", segments=count, keep_batchnorm=keep_batchnorm, **options)


def every_nth_block(n: int = 1, **options: Any) -> Strategy:
    """Every ``n``-th repeated block checkpointed (1: every block)."""
    return Strategy("every-n", every=n, **options)


def selective(
    ops: frozenset = EXPENSIVE_OPS, *, regions: int = 0, every: int = 1, **options: Any
) -> Strategy:
    """Checkpointed regions that keep the outputs of ``ops`` and recompute the rest: ``regions``
    equal runs of a Sequential, or every ``every``-th repeated block of another model."""
    return Strategy("selective", regions=regions, every=every, saved_ops=ops, **options)


def offloaded(**options: Any) -> Strategy:
    """Saved tensors in pinned host memory: all of a Sequential's (nothing recomputed), or the
    checkpoints of every (``every=n``: every n-th) repeated block of another model."""
    return Strategy("offload", **options)


def scheduled(
    schedule: SequentialSchedule,
    name: str = "",
    *,
    kind: StrategyKind = "plan",
    predicted: object | None = None,
) -> Strategy:
    """A Sequential run by ``schedule`` (a ``Plan``, ``NestedPlan``; ``kind="compile-budget"``
    for a ``CompileBudget``); ``predicted`` defaults to the schedule itself (a plan forecasts)."""
    if kind not in ("plan", "compile-budget"):
        raise ValueError(f"a schedule's kind is 'plan' or 'compile-budget', got {kind!r}")
    if predicted is None and kind == "plan":
        predicted = schedule
    return Strategy(kind, name=name, schedule=schedule, predicted=predicted)


def parse_strategy(text: str) -> Strategy:
    """A command-line word (``none``, ``every-block``, ``every-2``, ``segments-4``, ...) as its
    ``Strategy``: the spelling's row of ``STRATEGY_KINDS`` names the constructor that makes it."""
    row, number = spelled(text)
    if not row.constructor:
        return Strategy(cast(StrategyKind, row.kind))
    make: Callable[..., Strategy] = globals()[row.constructor]
    return make() if number is None else make(number)
