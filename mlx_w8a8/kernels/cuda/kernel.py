"""What a CUDA kernel is: one :class:`CudaKernel` definition, from which the registry's
candidate (``run``, ``supports``, ``variant``, ``stages``, ``bind_stages``,
``bind_group`` and the digest) is derived.

A ``linear`` definition states its launches for one problem and nothing else:

- :meth:`CudaKernel.activations`: the activation format (``act_key``) and the quantize
  launch (``None`` for a kernel that quantizes ``x`` itself: it then takes ``x``);
- :meth:`CudaKernel.apply`: the launch for one weight, reading the quantize launch's
  outputs in order;
- :meth:`CudaKernel.apply_group` (optional): the launch(es) for sibling weights fed the
  same ``x`` (q/k/v, gate/up): one launch with an output per member, or one launch per
  member.

The launches are :class:`~.launch.LaunchSpec` objects built from the problem's sizes,
dtype and weight; this module launches them directly (``run``, every call) or binds them
(``bind``: everything but the activations computed once, :meth:`LaunchSpec.bound`). The
tile and the code format (unsigned or flipped codes) are chosen once, in the
definition's own methods (``tile``), for all of these.
"""

from __future__ import annotations

from typing import Callable, Hashable, Iterator

import mlx.core as mx

from ...weight import dtype_name
from .. import registry, sources, tensormap
from . import launch
from .launch import FLOAT_DTYPES, GEMM_K_MULTIPLE, MAX_K, LaunchSpec


class CudaKernel:
    """One CUDA kernel of one op, as the tuner and the layers meet it.

    Subclasses set ``name``, ``op`` and ``needs`` (the capabilities of
    ``mlx_w8a8.kernels.cuda.status()`` it runs only with) and implement
    :meth:`refusals` and :meth:`variant`; ``linear`` kernels implement
    :meth:`activations` and :meth:`apply` (and :meth:`apply_group` where sibling
    weights run as one launch), the other ops :meth:`run`.
    """

    name: str = ""
    op: str = "linear"
    needs: tuple[str, ...] = ()
    act_scales: tuple[str, ...] = ("token",)  # the activation scalings it computes
    bound_form: str = "epilogue"  # its error bound (registry.Candidate.bound_form)

    # What it can run -------------------------------------------------------------------
    def refusals(self, p: registry.Problem) -> Iterator[str | None]:
        """Each requirement on ``p`` in turn: ``None`` where it holds, else why not
        (cheap checks first; a device probe only once the problem itself is valid)."""
        raise NotImplementedError

    def can_implement(self, p: registry.Problem) -> tuple[bool, str]:
        """Whether this kernel runs ``p`` here, and why not. Cheap; touches no device
        memory (``registry.Candidate.can_implement``).

        Args:
            p: the problem (op, M, N, K, dtype name, weight format, group size, bias).

        Returns:
            ``(True, "")``, or ``(False, reason)``: the first requirement that fails
            (dimension, dtype, weight format, bound or device capability), the value
            received and what is valid, prefixed ``[mlx_w8a8.<name>]``.
        """
        for why in self.refusals(p):
            if why is not None:
                return False, f"[mlx_w8a8.{self.name}] {why}"
        return True, ""

    def supports(self, p: registry.Problem) -> bool:
        """``can_implement(p)``'s verdict (``registry.Candidate.supports``)."""
        return self.can_implement(p)[0]

    def variant(self, p: registry.Problem) -> Hashable:
        """What this kernel compiles for ``p`` (``registry.Candidate.variant``)."""
        raise NotImplementedError

    # Its launches (linear) ------------------------------------------------------------
    def activations(self, p: registry.Problem,
                    lead: tuple[int, ...] | None = None) -> tuple[Hashable, LaunchSpec | None]:
        """``(act_key, quantize launch)`` for ``x`` ``[M, K]`` (or ``[*lead, K]``) of
        ``p.dtype``; ``(None, None)`` where :meth:`apply` takes ``x`` itself."""
        raise NotImplementedError

    def apply(self, p: registry.Problem, weight, bias,
              lead: tuple[int, ...] | None = None) -> LaunchSpec:
        """The launch computing ``y`` ``[*lead, N]`` for ``weight`` ``[N, K]`` and
        ``bias`` ``[N]`` (or ``None``) from :meth:`activations`' outputs (or ``x``)."""
        raise NotImplementedError

    def apply_group(self, p: registry.Problem, members,
                    lead: tuple[int, ...] | None = None) -> tuple[LaunchSpec, ...]:
        """Sibling weights' launches: one launch returning one ``[*lead, N_g]`` output
        per member, or one single-output launch per member. ``p`` is the members'
        summed problem (``N = sum N_g``), ``members`` a list of ``(weight, bias)``."""
        raise NotImplementedError

    @property
    def groups(self) -> bool:
        """Whether sibling weights run through :meth:`apply_group`."""
        return type(self).apply_group is not CudaKernel.apply_group

    # Derived forms (registry.Candidate) -------------------------------------------------
    def run(self, x: mx.array, weight, bias) -> mx.array:
        """:meth:`activations`' and :meth:`apply`'s launches, built and made on this
        call (``registry.Candidate.run``).

        Args:
            x: ``[M, K]`` float16/bfloat16/float32.
            weight: a ``QuantizedWeight`` ``[N, K]`` this kernel supports.
            bias: ``[N]`` or ``None``.

        Returns:
            ``[M, N]`` in ``x.dtype``.
        """
        p = linear_problem(x, weight, bias)
        _, quantize = self.activations(p)
        apply = self.apply(p, weight, bias)
        if quantize is None:
            return apply.launch(x)[0]
        return apply.launch(*quantize.launch(x))[0]

    def stages(self, p: registry.Problem):
        """``(act_key, quantize(x) -> acts, apply(acts, weight, bias, out_dtype) -> y)``
        (``registry.Candidate.stages``), or ``None`` where ``x`` is not quantized by a
        launch of its own: the two launches of :meth:`run`, made on each call."""
        key, quantize = self.activations(p)
        if quantize is None:
            return None
        takes = len(quantize.output_shapes)

        def apply(acts, weight, bias, out_dtype):
            q = p if out_dtype is None else _with_dtype(p, out_dtype)
            return self.apply(q, weight, bias).launch(*acts[:takes])[0]

        return key, lambda x: _acts(quantize.launch(x)), apply

    def bind(self, p: registry.Problem, weight, bias, lead: tuple[int, ...] | None = None):
        """The launches of :meth:`run` for one layer, everything but the activations
        computed here (``registry.Candidate.bind_stages``).

        Args:
            p: the layer's problem.
            weight: a ``QuantizedWeight`` ``[N, K]``; bias: ``[N]`` or ``None``.
            lead: the activation's leading shape (``prod(lead) == M``); ``(M,)`` if
                ``None``.

        Returns:
            ``(act_key, quantize, apply)``: ``quantize(x) -> acts`` for ``x``
            ``[*lead, K]`` of ``p.dtype`` and ``apply(acts) -> y`` ``[*lead, N]``; where
            :meth:`activations` has no launch, ``(None, None, apply)`` with ``apply(x)``.
        """
        key, quantize = self.activations(p, lead)
        apply = self.apply(p, weight, bias, lead)
        if quantize is None:
            return None, None, _bound_one(apply, 1, direct=True)
        return key, _bound_quantize(quantize), _bound_one(apply, len(quantize.output_shapes))

    def bind_group(self, p: registry.Problem, members, lead: tuple[int, ...] | None = None):
        """:meth:`apply_group`'s launches for sibling layers fed the same ``x``, bound as
        :meth:`bind` binds one layer's (``registry.Candidate.bind_group``).

        Args:
            p: the members' summed problem (``N = sum N_g``).
            members: 2 or 3 ``(weight, bias)`` pairs.
            lead: as :meth:`bind`.

        Returns:
            ``(act_key, quantize, apply)`` as :meth:`bind`, ``apply`` returning one
            ``[*lead, N_g]`` array per member, in order.
        """
        members = list(members)
        key, quantize = self.activations(p, lead)
        applies = self.apply_group(p, members, lead)
        if quantize is None:
            (one,) = applies
            return None, None, one.bound()
        takes = len(quantize.output_shapes)
        # A one-launch group takes 2 or more members (launch.sibling_bias), so one
        # launch per member is never mistaken for one launch with an output per member.
        if len(applies) == len(members):
            bound = [_bound_one(a, takes) for a in applies]
            return key, _bound_quantize(quantize), lambda acts: [b(acts) for b in bound]
        (one,) = applies
        run = one.bound()
        return key, _bound_quantize(quantize), lambda acts: run(*acts[:takes])


def linear_problem(x: mx.array, weight, bias) -> registry.Problem:
    """The ``linear`` problem of ``x`` ``[..., K]`` on ``weight`` and ``bias``."""
    k = x.shape[-1]
    return registry.Problem("linear", x.size // k, weight.n, k, dtype_name(x.dtype),
                            weight.format, weight.group_size, bias is not None)


def _with_dtype(p: registry.Problem, dtype: mx.Dtype) -> registry.Problem:
    name = dtype_name(dtype)
    if name == p.dtype:
        return p
    return registry.Problem(p.op, p.m, p.n, p.k, name, p.weight_format, p.group_size, p.has_bias)


def _acts(outputs) -> tuple:
    """A quantize launch's outputs as the activations an apply reads: the codes and
    scales with ``None`` for the absent row sums (``plain``), else as they are."""
    return (*outputs, None) if len(outputs) == 2 else tuple(outputs)


def _bound_quantize(spec: LaunchSpec) -> Callable:
    """``f(x) -> acts``: ``spec`` bound (:meth:`LaunchSpec.bound`), its outputs as
    :func:`_acts` gives them."""
    run = spec.bound()
    if len(spec.output_shapes) == 2:
        def run_plain(x):
            q, scale = run(x)
            return q, scale, None
        return run_plain
    return lambda x: tuple(run(x))


def _bound_one(spec: LaunchSpec, takes: int, direct: bool = False) -> Callable:
    """``f(acts) -> y``: ``spec`` bound, launched on the first ``takes`` activation
    arrays (``direct``: ``f(x) -> y`` on ``x`` itself), its one output."""
    run = spec.bound(slice(1))
    if direct:
        return lambda x: run(x)[0]
    if takes == 1:
        return lambda acts: run(acts[0])[0]
    if takes == 2:
        return lambda acts: run(acts[0], acts[1])[0]
    return lambda acts: run(*acts[:takes])[0]


# Requirements shared by the definitions (CudaKernel.refusals) --------------------------
def float_rows(p: registry.Problem) -> str | None:
    """A float activation of at least one row."""
    if p.dtype not in FLOAT_DTYPES:
        return f"the activation dtype must be one of {FLOAT_DTYPES}, got {p.dtype}"
    if p.m < 1:
        return f"M must be at least 1, got {p.m}"
    return None


def gemm_k(p: registry.Problem) -> str | None:
    """K a multiple of ``GEMM_K_MULTIPLE`` in ``(0, MAX_K)`` (16-byte code vectors,
    exact int32 sums of int8 products)."""
    if not (p.k % GEMM_K_MULTIPLE == 0 and 0 < p.k < MAX_K):
        return (f"K must be a positive multiple of {GEMM_K_MULTIPLE} below {MAX_K}, "
                f"got {p.k}")
    return None


def outputs(p: registry.Problem) -> str | None:
    if p.n < 1:
        return f"N must be at least 1, got {p.n}"
    return None


def weight_format(p: registry.Problem, *formats: str) -> str | None:
    if p.weight_format not in formats:
        return f"the weight format must be one of {formats}, got {p.weight_format!r}"
    return None


def hopper() -> str | None:
    """A compute capability 9.x GPU (``launch.is_sm90``: wgmma needs sm_90a)."""
    if not launch.is_sm90():
        return "needs a GPU of compute capability 9.x (sm_90a: wgmma), which this is not"
    return None


def tensor_maps() -> str | None:
    """Tensor maps encodable here (``tensormap.available``); ask after :func:`hopper`:
    the driver is probed only on a Hopper GPU."""
    if not tensormap.available():
        return f"needs tensor maps ({tensormap.unavailable() or 'not encodable here'})"
    return None


# The digest (registry.Candidate.digest) -----------------------------------------------
# The modules whose code a CUDA kernel's digest follows (sources.closure): this package,
# the tensor-map encoder and the matmul step cuda_dequant_matmul shares with
# mlx_dequant_matmul (kernels/dequant_matmul.py). A definition class reaches its base classes, the launch
# helpers its methods name and, through them, the constants and kernel files they read.
DIGEST_MODULES = (
    "mlx_w8a8.kernels.cuda", "mlx_w8a8.kernels.cuda.kernel", "mlx_w8a8.kernels.cuda.launch",
    "mlx_w8a8.kernels.cuda.tiles", "mlx_w8a8.kernels.cuda.tma",
    "mlx_w8a8.kernels.cuda.quantize", "mlx_w8a8.kernels.cuda.gemm",
    "mlx_w8a8.kernels.cuda.gemm_ws", "mlx_w8a8.kernels.cuda.gemm_grouped",
    "mlx_w8a8.kernels.cuda.gemv", "mlx_w8a8.kernels.cuda.gemm_dequant",
    "mlx_w8a8.kernels.cuda.dequant_matmul", "mlx_w8a8.kernels.dequant_matmul",
    tensormap.__name__,
)


def kernel_texts(file: str) -> list[str]:
    """What MLX compiles of ``file`` (:func:`launch.load`: its header after the headers
    it requires, and its bodies, comments stripped): a comment edited in a kernel file
    leaves tuning tables fresh, any code edit stales them."""
    header, bodies = launch.load(file)
    return [header] + [f"{name}\n{body}" for name, body in sorted(bodies.items())]


def digest(definition: type) -> str:
    """The digest of a kernel: :func:`sources.closure_digest` of its definition class
    (its methods, its base classes' and every helper of :data:`DIGEST_MODULES` they
    reach) and the kernel files named in that code (:func:`kernel_texts`)."""
    return sources.closure_digest((definition,), DIGEST_MODULES, (".cu",), kernel_texts)


# The registry's candidate ---------------------------------------------------------------
def candidate(kernel: CudaKernel) -> registry.Candidate:
    """``kernel`` as the registry's candidate, its digest :func:`digest` of its class.

    Kept out of the class on purpose: the digest follows the definition class and what it
    reaches, and this glue (how the registry is handed the methods, how a machine is
    probed for a CUDA GPU: ``launch.cuda_available``) changes nothing a launch computes,
    so editing it must not stale a tuning table."""
    linear = kernel.op == "linear"
    return registry.Candidate(
        name=kernel.name, backend="cuda", op=kernel.op, run=kernel.run,
        supports=kernel.supports, can_implement=kernel.can_implement,
        digest=digest(type(kernel)), available=launch.cuda_available,
        stages=kernel.stages if linear else None,
        bind_stages=kernel.bind if linear else None,
        bind_group=kernel.bind_group if linear and kernel.groups else None,
        variant=kernel.variant, act_scales=kernel.act_scales,
        w8a8=getattr(kernel, "w8a8", True), bound_form=kernel.bound_form)
