"""The ``pallas`` and ``auto`` memory-scan implementations: fused Pallas kernels.

- :mod:`~titans_lm.memory.pallas.scan`: ``pallas_scan`` (``impl="pallas"``), ``auto_scan``
  (``impl="auto"``) and the custom_vjp around the kernels.
- :mod:`~titans_lm.memory.pallas.plan`: which problems the kernels take (``make_plan``), the
  backend (``resolve_backend``), and the fallback log.
- :mod:`~titans_lm.memory.pallas.chunk`: the per-chunk arithmetic both lowerings share.
- :mod:`~titans_lm.memory.pallas.triton` (GPU) and :mod:`~titans_lm.memory.pallas.tpu` (TPU): the
  kernels. They import their Pallas lowering at module load, so they are imported only when a
  plan picks them, never from here.
"""

from titans_lm.memory.pallas.plan import KernelPlan, make_plan, resolve_backend
from titans_lm.memory.pallas.scan import auto_choice, auto_scan, kernel_scan, pallas_scan

__all__ = ["KernelPlan", "auto_choice", "auto_scan", "kernel_scan", "make_plan", "pallas_scan",
           "resolve_backend"]
