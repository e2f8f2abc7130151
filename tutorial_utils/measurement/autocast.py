"""Mixed precision in a dry run: ``torch.autocast``'s casts, emulated on the meta device.

Most people train with fp32 weights under ``torch.autocast(device_type="cuda",
dtype=torch.bfloat16)``. Autocast does not apply to meta tensors: it is a dispatch key that only
CPU, CUDA and a few other backends' tensors carry, and its kernels check the tensor's device
(``torch.autocast("cpu")`` around a meta ``linear`` returns float32). So a dry run would count an
fp32 step. ``EmulatedAutocast`` does what autocast does, at the same place: it registers Python
kernels for the listed ops at an autocast dispatch key no built-in backend uses
(``AutocastPrivateUse1``) and turns that key on for meta tensors in this thread only, so every
op of a policy list is cast above autograd, as the real autocast does (the casts and the
low-precision copies they make are in the graph and in the tracker's counts). fp32 weights used
as low-precision operands are cast once per autocast region and kept (autocast's cast cache).

Two policies are written out from PyTorch's source (``aten/src/ATen/autocast_mode.h`` and
``autocast_mode.cpp``): ``CUDA_POLICY``, what a GPU run does (the estimate's default), and
``CPU_POLICY``, which ``tests/test_autocast.py`` checks against a real ``torch.autocast("cpu")``
step, byte for byte, and against the ops the installed torch registers for each device.

Checkpoint recomputation re-enters autocast on a real device; on meta it cannot, so
``checkpoint_context_fn`` gives ``checkpoint(..., context_fn=...)`` a recompute context that
re-enters the emulation. ``transformers`` switches autocast off around its rotary embedding with
``maybe_autocast(..., enabled=False)``, a no-op on meta: inside the emulation it switches the
emulation off there too.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

__all__ = [
    "ambient_autocast",
    "AutocastPolicy",
    "CPU_POLICY",
    "CUDA_POLICY",
    "EmulatedAutocast",
    "forward_autocast",
    "FP32",
    "outside_autocast",
    "POLICIES",
    "step_kernels",
]

KEY = torch._C.DispatchKey.AutocastPrivateUse1  # type: ignore[attr-defined]  # not in the stubs
KEYSET = torch._C.DispatchKeySet(KEY)

LOWER = "lower_precision_fp"  # cast floating inputs to the autocast dtype
FP32 = "fp32"  # cast floating inputs to float32
FP32_SET_OPT_DTYPE = "fp32_set_opt_dtype"  # run with dtype=float32 unless a dtype is given
PROMOTE = "promote"  # cast floating inputs to the widest of them


@dataclass(frozen=True)
class AutocastPolicy:
    """One device's autocast op lists: ``{policy: ("op" or "op.overload", ...)}``."""

    device: str
    ops: dict[str, tuple[str, ...]]

    def items(self) -> Iterator[tuple[str, str]]:
        for policy, names in self.ops.items():
            for name in names:
                yield name, policy

    def installed(self) -> Iterator[tuple[str, str]]:
        """The ops the installed torch autocasts on this device: the lists follow the newest
        release, and an older one casts fewer (torch 2.9 does not cast ``rms_norm`` on CUDA),
        so an emulation of it leaves those alone too."""
        key = "AutocastCUDA" if self.device == "cuda" else "AutocastCPU"
        for name, policy in self.items():
            if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", key):
                yield name, policy


_CONVOLUTIONS = ("conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d")
_MATMULS = ("addmm", "matmul", "mm", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm")

# aten/src/ATen/autocast_mode.h, AT_FORALL_* (the AutocastCUDA registrations), torch 2.9-2.14
CUDA_POLICY = AutocastPolicy(
    "cuda",
    {
        LOWER: (
            "_convolution.deprecated",
            "_convolution",
            *_CONVOLUTIONS,
            "conv_transpose2d.input",
            "conv_transpose3d.input",
            "convolution",
            "prelu",
            *_MATMULS,
            "addmv",
            "addr",
            "einsum",
            "mv",
            "chain_matmul",
            "linalg_multi_dot",
            "_thnn_fused_lstm_cell",
            "_thnn_fused_gru_cell",
            "lstm_cell",
            "gru_cell",
            "rnn_tanh_cell",
            "rnn_relu_cell",
            "_scaled_dot_product_flash_attention",
            "scaled_dot_product_attention",
        ),
        FP32: (
            *("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2"),
            *("log1p", "reciprocal", "rsqrt", "sinh", "tan", "softplus"),
            *("pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar"),
            *("layer_norm", "native_layer_norm", "rms_norm", "group_norm"),
            *("frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim", "cosine_similarity"),
            *("poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d"),
            *("hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss"),
            *("mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss"),
            *("triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits"),
            *("dist", "pdist", "cdist", "renorm", "logsumexp"),
            *("upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d"),
            *("_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d"),
            *("upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa"),
            *("upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa"),
        ),
        FP32_SET_OPT_DTYPE: (
            *("prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum"),
            *("linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord"),
            *("sum", "sum.dim_IntList"),
        ),
        PROMOTE: (
            *("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot"),
            *("grid_sampler", "index_put", "tensordot", "scatter_add"),
        ),
    },
)

# aten/src/ATen/autocast_mode.cpp, TORCH_LIBRARY_IMPL(aten, AutocastCPU, m): the ops a model of
# this tutorial can reach (the CPU list's linear algebra and FFT ops are left out, and
# ``tests/test_autocast.py`` checks every op listed here is registered for AutocastCPU).
CPU_POLICY = AutocastPolicy(
    "cpu",
    {
        LOWER: (
            *_CONVOLUTIONS,
            *("conv1d.padding", "conv2d.padding", "conv3d.padding", "_addmm_activation"),
            *("_convolution.deprecated", "conv_transpose2d.input", "conv_transpose3d.input"),
            *("prelu", "scaled_dot_product_attention", "_native_multi_head_attention"),
            *_MATMULS,
        ),
        FP32: (
            *("avg_pool3d", "binary_cross_entropy", "grid_sampler", "prod", "prod.dim_int"),
            *("cdist", "max_pool3d", "adaptive_avg_pool3d", "adaptive_max_pool3d", "trace"),
            *("reflection_pad1d", "reflection_pad2d", "replication_pad1d", "replication_pad2d"),
            *("replication_pad3d", "mse_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d"),
            *("hinge_embedding_loss", "poisson_nll_loss", "smooth_l1_loss", "cross_entropy_loss"),
            *("l1_loss", "huber_loss", "margin_ranking_loss", "soft_margin_loss", "kl_div"),
            *("triplet_margin_loss", "multi_margin_loss", "multilabel_margin_loss"),
            "binary_cross_entropy_with_logits",
        ),
        PROMOTE: ("stack", "cat", "index_copy"),
    },
)

POLICIES = {"cuda": CUDA_POLICY, "cpu": CPU_POLICY}


def _overload(name: str):
    op_name, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, op_name), overload or "default")


def _eligible(value) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.dtype != torch.float64
    )


class EmulatedAutocast:
    """``torch.autocast(device_type=policy.device, dtype=dtype)`` for meta tensors.

    ``measure_step(..., autocast=...)`` takes one for any device: on a real device it runs the
    real ``torch.autocast`` with its dtype, on meta the emulation.

    ``kernels()`` registers the casts (for the whole step: recomputation happens in backward);
    ``enabled()`` turns them on in this thread, with a fresh cast cache, as entering autocast
    does. Outside ``enabled()`` nothing is cast.
    """

    def __init__(self, dtype: torch.dtype = torch.bfloat16, policy: AutocastPolicy = CUDA_POLICY):
        if dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"autocast dtype must be bfloat16 or float16, got {dtype}")
        self.dtype = dtype
        self.policy = policy
        self._caches: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = []

    def describe(self) -> str:
        name = str(self.dtype).removeprefix("torch.")
        return f"fp32 weights under autocast({self.policy.device}, {name}) (emulated on meta)"

    # -- the casts --------------------------------------------------------------------------

    def _cast(self, value, dtype: torch.dtype):
        if isinstance(value, (list, tuple)):
            return type(value)(self._cast(item, dtype) for item in value)
        if not _eligible(value) or value.dtype == dtype:
            return value
        cacheable = (
            dtype == self.dtype
            and value.dtype == torch.float32
            and value.requires_grad
            and value.is_leaf
            and not value._is_view()
            and self._caches
        )
        if not cacheable:
            return value.to(dtype)
        cache = self._caches[-1]
        if id(value) not in cache:
            cache[id(value)] = (value, value.to(dtype))
        return cache[id(value)][1]

    def _cast_last_first(self, args: tuple, kwargs: dict, dtype: torch.dtype) -> tuple[tuple, dict]:
        """Every argument cast, the last one first, as PyTorch's autocast wrapper does: it casts
        them inside a C++ call's argument list, which GCC (the Linux wheels, CUDA's included)
        evaluates right to left. The order decides which cast copy is alive first, so a peak
        that falls between two casts matches to the byte."""
        cast_kwargs = {k: self._cast(v, dtype) for k, v in reversed(kwargs.items())}
        cast_args = [self._cast(v, dtype) for v in reversed(args)]
        return tuple(reversed(cast_args)), {k: cast_kwargs[k] for k in kwargs}

    def _kernel(self, name: str, policy: str) -> Callable:
        op = _overload(name)
        dtype_index = next(
            (i for i, a in enumerate(op._schema.arguments) if a.name == "dtype"), None
        )

        def kernel(*args, **kwargs):
            with torch._C._ExcludeDispatchKeyGuard(KEYSET):
                tensors = [v for v in (*args, *kwargs.values()) for v in _flat(v) if _eligible(v)]
                if policy == LOWER:
                    target = self.dtype
                elif policy == FP32:
                    target = torch.float32
                elif policy == PROMOTE:
                    target = (
                        functools.reduce(torch.promote_types, [t.dtype for t in tensors])
                        if tensors
                        else None
                    )
                else:  # FP32_SET_OPT_DTYPE: the first argument decides, the op casts itself
                    if args and _eligible(args[0]) and dtype_index is not None:
                        args, kwargs = _set_dtype(op, dtype_index, args, kwargs)
                    return op(*args, **kwargs)
                if target is not None:
                    args, kwargs = self._cast_last_first(args, kwargs, target)
                return op(*args, **kwargs)

        return kernel

    # -- switching it on ----------------------------------------------------------------------

    @contextlib.contextmanager
    def kernels(self) -> Iterator[None]:
        """The policy's casts registered at the emulation's dispatch key (and nothing else)."""
        library = torch.library.Library("aten", "IMPL")
        fallthrough = torch.library.Library("_", "IMPL")
        fallthrough.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
        for name, policy in self.policy.installed():
            library.impl(name, self._kernel(name, policy), "AutocastPrivateUse1")
        try:
            with _autocast_off_regions(self):
                yield
        finally:
            library._destroy()
            fallthrough._destroy()

    @contextlib.contextmanager
    def enabled(self) -> Iterator[None]:
        """Autocast on in this thread, with its own cast cache (emptied on exit)."""
        self._caches.append({})
        try:
            with (
                torch._C._IncludeDispatchKeyGuard(KEY),
                torch._C._SetExcludeDispatchKeyGuard(KEY, False),
            ):
                yield
        finally:
            self._caches.pop()

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """Autocast off inside (``torch.autocast(..., enabled=False)``)."""
        with torch._C._ExcludeDispatchKeyGuard(KEYSET):
            yield

    def checkpoint_context_fn(
        self, inner: Callable[[], tuple] | None = None
    ) -> Callable[[], tuple]:
        """A ``context_fn`` for ``checkpoint`` whose recomputation runs under the emulation,
        around ``inner``'s contexts (selective checkpointing's, say) where given."""

        def context_fn() -> tuple:
            forward, recompute = inner() if inner is not None else (None, None)

            @contextlib.contextmanager
            def recomputing() -> Iterator[None]:
                with self.enabled(), recompute or contextlib.nullcontext():
                    yield

            return forward or contextlib.nullcontext(), recomputing()

        return context_fn


def _flat(value) -> tuple:
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def _set_dtype(op, index: int, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``op``'s optional dtype set to float32 where the caller left it unset."""
    if op._schema.arguments[index].kwarg_only:
        if kwargs.get("dtype") is None:
            kwargs = {**kwargs, "dtype": torch.float32}
    elif len(args) > index:
        if args[index] is None:
            args = (*args[:index], torch.float32, *args[index + 1 :])
    elif kwargs.get("dtype") is None:
        kwargs = {**kwargs, "dtype": torch.float32}
    return args, kwargs


@contextlib.contextmanager
def _autocast_off_regions(emulation: EmulatedAutocast) -> Iterator[None]:
    """``transformers``' ``maybe_autocast(device_type="meta", enabled=False)`` switches the
    emulation off, as ``torch.autocast(..., enabled=False)`` switches autocast off on a device."""
    patched = []
    for name, module in list(sys.modules.items()):
        # the module's own dict: a getattr would run a module's __getattr__ (torch.utils.mkldnn's
        # warns that torch.jit.script_method is deprecated), and only transformers' are wanted
        if not name.startswith("transformers") or module is None:
            continue
        original = vars(module).get("maybe_autocast")
        if original is None:
            continue

        def maybe_autocast(device_type, *args, _original=original, **kwargs):
            if device_type == "meta" and kwargs.get("enabled", True) is False:
                return emulation.disabled()
            return _original(device_type, *args, **kwargs)

        setattr(module, "maybe_autocast", maybe_autocast)  # noqa: B010 (a module attribute)
        patched.append((module, original))
    try:
        yield
    finally:
        for module, original in patched:
            setattr(module, "maybe_autocast", original)  # noqa: B010


def forward_autocast(
    device: torch.device, autocast: EmulatedAutocast | None
) -> contextlib.AbstractContextManager:
    """The forward's autocast: the real ``torch.autocast`` on a device that has one, the
    emulation on meta; nothing without ``autocast``."""
    if autocast is None:
        return contextlib.nullcontext()
    if device.type == "meta":
        return autocast.enabled()
    return _real_autocast(device.type, autocast.dtype)


@contextlib.contextmanager
def _real_autocast(device_type: str, dtype: torch.dtype) -> Iterator[None]:
    """``torch.autocast``, its cast cache emptied on the way out even when it is nested in the
    caller's own autocast (where leaving it would keep the low-precision weights cached)."""
    with torch.autocast(device_type=device_type, dtype=dtype):
        yield
    torch.clear_autocast_cache()


def outside_autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """The caller's ``torch.autocast`` switched off for a whole step on a real device, so that
    backward and the optimizer step run outside it and only ``forward_autocast`` casts, as in an
    AMP training loop (meta tensors ignore it anyway)."""
    if device.type == "meta" or not torch.is_autocast_enabled(device.type):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, enabled=False)


def step_kernels(
    device: torch.device, autocast: EmulatedAutocast | None
) -> contextlib.AbstractContextManager:
    """The emulation's kernels for a whole dry-run step (recomputation happens in backward)."""
    if autocast is None or device.type != "meta":
        return contextlib.nullcontext()
    return autocast.kernels()


def ambient_autocast(device: torch.device | None = None) -> EmulatedAutocast | None:
    """The ``torch.autocast`` active in this thread as an ``EmulatedAutocast``, or None: for a dry
    run (``device`` meta or None) any device type's, CUDA's before the CPU's; for a step on a real
    device, that device type's."""
    for device_type, policy in POLICIES.items():
        if device is not None and device.type not in ("meta", device_type):
            continue
        if torch.is_autocast_enabled(device_type):
            return EmulatedAutocast(torch.get_autocast_dtype(device_type), policy)
    return None
