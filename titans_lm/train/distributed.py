"""JAX's multi-process runtime: ``jax.distributed.initialize`` from flags or the environment.

One training run may be N cooperating processes (on one machine or several). Each process owns
its local devices; together they form one global device list, one mesh, one global batch:

- the data pipeline draws the same global batches in every process and each process reads only
  its own rows (``titans_lm.data.pipeline``), so the losses do not depend on the process count;
- orbax writes each checkpoint cooperatively (every process its shards; process 0 finalises it
  and writes its integrity manifest);
- metrics, the progress bar and the log come from process 0.

Where the description comes from, first match wins:

1. explicit arguments (the ``titans-lm train`` flags ``--coordinator_address``,
   ``--num_processes``, ``--process_id``);
2. ``JAX_COORDINATOR_ADDRESS`` with ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` (what
   ``titans-lm launch`` sets);
3. a cluster JAX detects itself: SLURM (``SLURM_NTASKS`` > 1), Open MPI
   (``OMPI_COMM_WORLD_SIZE`` > 1), multi-host TPU slices (``TPU_WORKER_HOSTNAMES`` listing several
   hosts).

Otherwise nothing happens (a single process). On CPU the cross-process collectives are gloo's
(``jax_cpu_collectives_implementation``); every process must see the same number of local devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=N``). Timeouts are bounded so that a missing
peer fails the run instead of hanging it: ``init_timeout_s`` for all processes to join, and the
coordination service's heartbeat (``heartbeat_timeout_s``) to notice a dead peer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import jax

from titans_lm.train import sharding as shd

DEFAULT_INIT_TIMEOUT_S = 120
DEFAULT_HEARTBEAT_TIMEOUT_S = 30


def _int(value, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def resolve(coordinator_address: str | None = None, num_processes: int | None = None,
            process_id: int | None = None, env: Mapping[str, str] | None = None
            ) -> dict | None:
    """The ``jax.distributed.initialize`` arguments for this process, or None (single process).

    Returns ``{}`` for a cluster JAX detects itself (SLURM, Open MPI, TPU slices).

    Raises:
      ValueError: an incomplete or inconsistent description (naming the flag or variable).
    """
    env = os.environ if env is None else env
    if coordinator_address or num_processes is not None or process_id is not None:
        src = ("--coordinator_address", "--num_processes", "--process_id")
        vals = (coordinator_address, num_processes, process_id)
    elif env.get("JAX_COORDINATOR_ADDRESS"):
        src = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
        vals = tuple(env.get(k) for k in src)
    else:
        multi = (_int(env.get("SLURM_NTASKS", "1"), "SLURM_NTASKS") > 1
                 or _int(env.get("OMPI_COMM_WORLD_SIZE", "1"), "OMPI_COMM_WORLD_SIZE") > 1
                 or "," in env.get("TPU_WORKER_HOSTNAMES", ""))
        return {} if multi else None
    missing = [s for s, v in zip(src, vals) if v in (None, "")]
    if missing:
        raise ValueError(f"multi-process run: {', '.join(missing)} missing (set all of "
                         f"{', '.join(src)})")
    address, n, pid = vals[0], _int(vals[1], src[1]), _int(vals[2], src[2])
    if ":" not in str(address):
        raise ValueError(f"{src[0]} must be host:port, got {address!r}")
    if n < 1 or not 0 <= pid < n:
        raise ValueError(f"{src[2]}={pid} must lie in [0, {src[1]}={n})")
    return {"coordinator_address": str(address), "num_processes": n, "process_id": pid}


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, init_timeout_s: int = DEFAULT_INIT_TIMEOUT_S,
               heartbeat_timeout_s: int = DEFAULT_HEARTBEAT_TIMEOUT_S) -> bool:
    """Join the multi-process run this process belongs to (see the module docstring).

    Must run before anything else touches JAX's backends (the CLI calls it first).

    Returns:
      True when the distributed runtime was initialised (False: a single process).

    Raises:
      ValueError: an incomplete description (see :func:`resolve`).
      RuntimeError: the peers did not all join within ``init_timeout_s`` (from JAX).
    """
    kwargs = resolve(coordinator_address, num_processes, process_id)
    if kwargs is None:
        return False
    if kwargs.get("num_processes") == 1:
        return False
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**kwargs, initialization_timeout=init_timeout_s,
                               heartbeat_timeout_seconds=heartbeat_timeout_s,
                               shutdown_timeout_seconds=init_timeout_s)
    return True


def check_process_rows(mesh, batch_rows: int) -> None:
    """The rows of a ``[batch_rows, ...]`` batch sharded over the mesh's batch axes that this
    process's devices hold must be block ``process_index`` of ``process_count`` contiguous
    blocks (what the data pipeline gives it).

    Raises:
      ValueError: the mesh interleaves the processes' devices along the batch axes.
    """
    n, i = jax.process_count(), jax.process_index()
    if n == 1:
        return
    idx = shd.batch_sharding(mesh).addressable_devices_indices_map((batch_rows,))
    rows = sorted({r for sl in idx.values() for r in range(*sl[0].indices(batch_rows))})
    block = batch_rows // n
    if rows != list(range(i * block, (i + 1) * block)):
        raise ValueError(f"process {i} of {n}: its devices hold batch rows {rows[:4]}..., not the "
                         f"contiguous block {i * block}..{(i + 1) * block - 1}; the mesh must place "
                         f"each process's devices together along mesh.data x mesh.fsdp")



__all__ = ["check_process_rows", "initialize", "resolve"]
