"""Model FLOPs utilisation of training: the model's FLOPs per second over the devices' peak.

The model's FLOPs of a train step are 3x the forward's matmul FLOPs of the architecture
(:func:`titans_lm.models.flops.count_flops`, its ``model`` count: PaLM's convention, Chowdhery et
al. 2022 appendix B; recomputation by remat not counted) times the batch's sequences.

The peak (:func:`peak_flops`): ``TITANS_LM_PEAK_TFLOPS`` (the peak of all the run's devices
together, e.g. a datasheet's dense bfloat16 figure) when set; otherwise measured once per process
as the best of a few large matmuls in the compute dtype on the first device (1024 x 1024 on a
CPU, 4096 x 4096 on an accelerator), times the number of devices of the mesh on an accelerator
(a CPU's virtual devices share one machine, whose peak the matmul measured). A measured peak is
below a datasheet's, so the MFU it gives is the higher of the two.
"""

from __future__ import annotations

import functools
import os
import time

import jax
import jax.numpy as jnp

from titans_lm.models.flops import count_flops

ENV = "TITANS_LM_PEAK_TFLOPS"


def train_step_flops(model_cfg, seq_len: int, batch_size: int) -> float | None:
    """Model FLOPs of one train step on ``batch_size`` sequences of ``seq_len`` tokens, or None
    for a backbone the FLOP model does not count."""
    try:
        return 3.0 * count_flops(model_cfg, seq_len).model_total * batch_size
    except (ValueError, KeyError, AttributeError):
        return None


@functools.cache
def _measured_peak(platform: str, dtype: str) -> float:
    """FLOP/s of the best of 5 timed n x n matmuls on the first device of ``platform``."""
    n = 1024 if platform == "cpu" else 4096
    device = jax.devices(platform)[0]
    a = jax.device_put(jnp.ones((n, n), dtype), device)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best


def peak_flops(mesh, compute_dtype: str = "float32") -> tuple[float, str]:
    """``(FLOP/s, how it was found)``: the peak of the mesh's devices (module docstring).

    Raises:
      ValueError: ``TITANS_LM_PEAK_TFLOPS`` is not a positive number.
    """
    value = os.environ.get(ENV, "").strip()
    if value:
        try:
            tflops = float(value)
            if not tflops > 0:
                raise ValueError
        except ValueError:
            raise ValueError(f"{ENV}={value!r}: must be a positive number of TFLOP/s (the peak "
                             f"of all the run's devices), e.g. {ENV}=989") from None
        return tflops * 1e12, f"{ENV}={value}"
    device = mesh.devices.flat[0]
    per_device = _measured_peak(device.platform, str(jnp.dtype(compute_dtype)))
    if device.platform == "cpu":
        return per_device, f"a measured {compute_dtype} matmul on the CPU"
    return per_device * mesh.size, (f"a measured {compute_dtype} matmul x {mesh.size} "
                                    f"{device.platform} device(s)")


__all__ = ["peak_flops", "train_step_flops"]
