"""Which memory problems the Pallas kernels take, with which lowering and which block sizes.

:func:`make_plan` turns a validated ``memory_scan`` call into a :class:`KernelPlan` (a hashable
description the kernels are built from) or into the reason it falls outside the kernels, in which
case ``impl="pallas"`` runs ``chunked`` and logs that reason once.

Supported (both lowerings):

* inner model: ``LinearMemory(bias=False)`` with d_k, d_v in {16, 32, 64, 128, 256}, or
  ``MLPMemory(depth=2, bias=False)`` with activation "silu" or "gelu_tanh", d_k, d_v in
  {16, 32, 64, 128} and a hidden width that is a multiple of 16 (the kernels tile it in blocks
  of a power of two >= 16 dividing it). Not supported: biases, ResidualLN (TTT's x + LN(f(x))),
  depth 3-4, exact GELU (erf has no Triton lowering).
* chunk_size in {16, 32, 64}; any T >= 1 (a last partial chunk, T < chunk_size); resets at chunk
  starts; read "after_write" or "chunk_start". On Triton, chunk 64 only where a program's shared
  memory stays well under the 227 KiB per block of an H100/H200: not for the linear memory with
  d = 256 nor the MLP with d >= 64 (measured by compiling the kernels' Triton IR with Triton 3.9
  for sm_90, float32 "highest": at chunk 64 linear d128 168 KiB, d256 228 KiB; MLP d32 192 KiB,
  d64 208 KiB, d128 288 KiB; at chunk 32 at most 120 KiB).
* dtypes: float32 or bfloat16 (float16) inputs, computed in float32; float64 only in the Triton
  kernel's interpret mode (the TPU and its interpreter have no float64; the compiled Triton
  float64 path is not exercised).

Lowerings: "triton" (Pallas Triton, NVIDIA/AMD GPUs) and "tpu" (Pallas Mosaic TPU). The default
follows ``jax.default_backend()``: gpu -> triton, tpu -> tpu, cpu -> triton in interpret mode.
Block sizes: the chunk is one block of b rows; on Triton the linear memory's value columns are cut
into blocks of block_v = min(d_v, 4096 // d_k) (one program each, parallel), and the MLP's hidden
units into blocks of block_h <= 4096 // (d_k + d_v), so that a program's state tiles stay near 8K
float32 values (registers); on the TPU the whole state is one VMEM block (block_v = d_v,
block_h = hidden).
"""

from __future__ import annotations

import dataclasses
import logging
import math

import jax
import jax.numpy as jnp

from titans_lm.logs import warn_once
from titans_lm.memory.inner_models import InnerModel, LinearMemory, MLPMemory
from titans_lm.memory.pallas.chunk import KERNEL_ACTIVATIONS

logger = logging.getLogger("titans_lm.memory.pallas")

SUPPORTED_CHUNK_SIZES = (16, 32, 64)
LINEAR_DIMS = (16, 32, 64, 128, 256)
MLP_DIMS = (16, 32, 64, 128)
BACKENDS = ("triton", "tpu")
# Data-matmul precisions: "highest" (IEEE float32 on Triton, i.e. FMA, no tensor cores; exact
# float32 passes on TPU), "tf32x3" (three TF32 tensor-core passes, ~float32 accuracy; compiled
# Triton only), "default" (the platform's fast float32 matmul: TF32 on NVIDIA GPUs).
PRECISIONS = ("highest", "tf32x3", "default")
# Values per program in the Triton kernel's state tiles (P and S of one tile).
TRITON_TILE_VALUES = 8192
# Largest chunk per (kind, largest head dim) on Triton where the default (64) would exceed
# ~200 KiB of shared memory per program (see the module docstring).
TRITON_MAX_CHUNK = {("linear", 256): 32, ("mlp", 64): 32, ("mlp", 128): 32}



@dataclasses.dataclass(frozen=True)
class KernelPlan:
    """Everything static about one kernel launch (hashable: a custom_vjp / jit static argument).

    kind: "linear" | "mlp". backend: "triton" | "tpu". interpret: run the kernel in Pallas'
    interpreter (CPU, or a lowering other than the local accelerator's).
    seq_len: T. chunk_size: b. group: chunks per saved state (chunks_per_checkpoint);
    n_groups: ceil(ceil(T / b) / group); the kernel runs n_groups * group chunks (empty ones at
    the end leave the state unchanged).
    d_k, d_v, hidden (0 for linear); block_v, block_h: tile sizes (see the module docstring).
    read: "after_write" | "chunk_start". dtype: input dtype name; compute_dtype: float32/float64.
    precision: of the data matmuls (see PRECISIONS); the gate-matrix matmuls are always
      float32-accurate (:meth:`coefficient_precision`).
    num_warps: Triton warps per program.
    running_mean: TTT's running-mean reads (``memory_scan(running_mean=True)``).
    log_keep: the forget-gate argument of :func:`~titans_lm.memory.pallas.scan.kernel_scan` is
      log(1 - alpha) (``memory_scan(log_keep=...)``), not alpha.
    """

    model: InnerModel
    kind: str
    backend: str
    interpret: bool
    seq_len: int
    chunk_size: int
    group: int
    n_groups: int
    d_k: int
    d_v: int
    hidden: int
    block_v: int
    block_h: int
    read: str
    dtype: str
    compute_dtype: str
    precision: str
    num_warps: int
    running_mean: bool = False
    log_keep: bool = False

    @property
    def n_chunks(self) -> int:
        """Chunks the kernel runs (a multiple of ``group``)."""
        return self.n_groups * self.group

    @property
    def activation(self) -> str:
        return self.model.activation if self.kind == "mlp" else ""

    def lax_precision(self):
        """Precision of the data matmuls."""
        return _LAX_PRECISION[self.precision]()

    def coefficient_precision(self):
        """Precision of the gate-matrix matmuls: float32-accurate (TF32 x3 on compiled Triton)."""
        compiled_triton = self.backend == "triton" and not self.interpret
        return _LAX_PRECISION["tf32x3" if compiled_triton else "highest"]()


_LAX_PRECISION = {
    "highest": lambda: jax.lax.Precision.HIGHEST,
    "tf32x3": lambda: jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3,
    "default": lambda: jax.lax.Precision.DEFAULT,
}


def log_fallback(reason: str) -> None:
    """Log (once per distinct reason) that impl="pallas" runs ``chunked`` instead."""
    warn_once(logger, "memory impl 'pallas' falls back to 'chunked': %s", reason)


def platform_backend(platform: str) -> tuple[str, bool] | None:
    """(lowering, interpret) that impl="pallas" uses on a JAX platform; None if it has none."""
    if platform == "gpu":
        return "triton", False
    if platform == "tpu":
        return "tpu", False
    if platform == "cpu":
        return "triton", True
    return None


def resolve_backend(backend: str | None, interpret: bool | None, platform: str) -> tuple[str, bool]:
    """The lowering and interpret flag for explicit options on this platform.

    Raises:
      ValueError: for an unknown backend, or interpret=False with a lowering the local platform
        cannot compile.
    """
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"pallas backend must be one of {BACKENDS} (or None = from the platform), "
                         f"got {backend!r}")
    default = platform_backend(platform)
    if backend is None:
        if default is None:
            raise ValueError(f"no Pallas lowering for platform {platform!r}; pass backend= and "
                             f"interpret=True")
        backend = default[0]
    native = {"triton": "gpu", "tpu": "tpu"}[backend]
    if interpret is None:
        interpret = platform != native
    elif not interpret and platform != native:
        raise ValueError(f"the {backend!r} Pallas kernel cannot be compiled on platform "
                         f"{platform!r}; pass interpret=True (or leave interpret=None)")
    return backend, bool(interpret)


def _largest_block(total: int, limit: int, minimum: int = 16) -> int | None:
    """Largest power of two in [minimum, limit] dividing total (None if there is none)."""
    block = 1 << max(0, int(math.floor(math.log2(max(limit, 1)))))
    while block >= minimum:
        if total % block == 0:
            return block
        block //= 2
    return None


def make_plan(model: InnerModel, params0, dtype, *, seq_len: int, chunk_size: int, read: str,
              chunks_per_checkpoint: int, backend: str, interpret: bool,
              precision: str = "highest", running_mean: bool = False,
              log_keep: bool = False) -> KernelPlan | str:
    """A KernelPlan for this problem, or a one-line reason why the kernels do not take it.

    Args:
      model: the inner model spec; params0: its parameter tuple (one head; shapes only).
      dtype: the common input dtype. seq_len: T. chunk_size: b. read: read mode.
      chunks_per_checkpoint: chunks per saved state for the backward pass (>= 1).
      backend, interpret: from :func:`resolve_backend`.
      precision: one of PRECISIONS.
      running_mean, log_keep: see :class:`KernelPlan`.
    Raises:
      ValueError: for chunks_per_checkpoint < 1, an unknown precision or "tf32x3" outside the
        compiled Triton kernel (bad arguments, not unsupported problems).
    """
    if int(chunks_per_checkpoint) != chunks_per_checkpoint or chunks_per_checkpoint < 1:
        raise ValueError(f"chunks_per_checkpoint must be a positive integer, "
                         f"got {chunks_per_checkpoint}")
    if precision not in PRECISIONS:
        raise ValueError(f"pallas precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "tf32x3" and (backend != "triton" or interpret):
        raise ValueError("pallas precision 'tf32x3' needs the compiled Triton kernel")
    dtype = jnp.dtype(dtype)
    if dtype == jnp.float64:
        if not interpret or backend != "triton":
            return "float64 runs only in the Triton kernel's interpret mode"
        compute = "float64"
    elif dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
        compute = "float32"
    else:
        return f"dtype {dtype} is not supported (float32 / bfloat16)"
    if chunk_size not in SUPPORTED_CHUNK_SIZES:
        return f"chunk_size {chunk_size} is not in {SUPPORTED_CHUNK_SIZES}"

    if type(model) is LinearMemory and not model.bias:
        kind = "linear"
        (W,) = params0
        d_k, d_v = W.shape
        hidden = 0
        if d_k not in LINEAR_DIMS or d_v not in LINEAR_DIMS:
            return f"linear memory of shape {d_k}x{d_v}: head dims must be in {LINEAR_DIMS}"
    elif type(model) is MLPMemory and model.depth == 2 and not model.bias:
        kind = "mlp"
        if model.activation not in KERNEL_ACTIVATIONS:
            return (f"MLP activation {model.activation!r} is not in {sorted(KERNEL_ACTIVATIONS)} "
                    f"(exact GELU needs erf, which Triton lacks)")
        W1, W2 = params0
        d_k, hidden = W1.shape
        d_v = W2.shape[1]
        if d_k not in MLP_DIMS or d_v not in MLP_DIMS:
            return f"MLP memory {d_k}->{hidden}->{d_v}: head dims must be in {MLP_DIMS}"
        if hidden % 16:
            return f"MLP hidden width {hidden} is not a multiple of 16"
    else:
        return (f"inner model {model!r} is not supported (linear or 2-layer MLP memories without "
                f"biases or ResidualLN)")

    if backend == "triton":
        max_chunk = TRITON_MAX_CHUNK.get((kind, max(d_k, d_v)), max(SUPPORTED_CHUNK_SIZES))
        if chunk_size > max_chunk:
            return (f"chunk_size {chunk_size} with a {kind} memory of head dim {max(d_k, d_v)} "
                    f"needs too much shared memory in the Triton kernel (max chunk {max_chunk})")
        block_v = min(d_v, TRITON_TILE_VALUES // (2 * d_k)) if kind == "linear" else d_v
        block_h = (_largest_block(hidden, TRITON_TILE_VALUES // (2 * (d_k + d_v)))
                   if kind == "mlp" else 0)
        if kind == "mlp" and block_h is None:
            return f"MLP hidden width {hidden} has no power-of-two block >= 16 dividing it"
        num_warps = 4 if max(d_k, d_v) <= 64 else 8
    else:
        block_v, block_h, num_warps = d_v, hidden, 0

    n_chunks = math.ceil(seq_len / chunk_size)
    group = min(int(chunks_per_checkpoint), n_chunks)
    return KernelPlan(model=model, kind=kind, backend=backend, interpret=interpret,
                      seq_len=int(seq_len), chunk_size=chunk_size, group=group,
                      n_groups=math.ceil(n_chunks / group), d_k=d_k, d_v=d_v, hidden=hidden,
                      block_v=block_v, block_h=block_h, read=read, dtype=dtype.name,
                      compute_dtype=compute, precision=precision, num_warps=num_warps,
                      running_mean=bool(running_mean), log_keep=bool(log_keep))
