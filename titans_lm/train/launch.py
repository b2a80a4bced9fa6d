"""``titans-lm launch``: run ``titans-lm train`` as N cooperating processes on this machine (JAX's
distributed runtime).

    titans-lm launch --num_processes 2 --devices_per_process 4 -- \\
        --config=configs/transformer.py:tiny --workdir=runs/tiny-2x4

Everything after ``--`` goes to ``titans-lm train`` (``--command eval`` etc. for another
command). Each process gets ``JAX_COORDINATOR_ADDRESS=127.0.0.1:<free port>``,
``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID`` and its own virtual CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=<devices_per_process>``; on an accelerator
machine pass ``--devices_per_process 0`` to leave the device setup alone). Process 0 writes to
this terminal; the others write to ``<log_dir>/process_<i>.log``.

Watching: if a process exits with a non-zero status (or is killed), the others are stopped
(SIGTERM, then SIGKILL after ``--grace_s``), the failed process and the last lines of its log are
named, and the launcher exits with that process's status. Ctrl-C / SIGTERM to the launcher is
passed on to every process (they save a checkpoint and stop). ``--timeout_s`` bounds the whole
run. Exit status: 0 when every process finished with 0; otherwise the first failure's status
(128 + signal for a process killed by a signal).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


def _tail(path: Path, n: int = 8) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join("    " + ln for ln in lines[-n:])


def process_env(i: int, n: int, port: int, devices: int, base: dict | None = None) -> dict:
    """The environment of process ``i`` of ``n``."""
    env = dict(os.environ if base is None else base)
    env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(n),
               JAX_PROCESS_ID=str(i))
    if devices > 0:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                            f" --xla_force_host_platform_device_count={devices}").strip()
        env.setdefault("JAX_PLATFORMS", "cpu")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def launch(args: list[str], *, num_processes: int, devices_per_process: int = 4,
           command: str = "train", log_dir: str | Path | None = None, timeout_s: float = 3600,
           grace_s: float = 20, port: int | None = None, out=None, on_start=None) -> int:
    """Start, watch and stop the processes; returns the exit status (see the module docstring).

    ``on_start(processes)`` is called with the ``subprocess.Popen`` list once all are started.
    """
    out = sys.stderr if out is None else out
    port = port or free_port()
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="titans-launch-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    procs, logs = [], []
    cmd = [sys.executable, "-m", "titans_lm.cli", command, *args]
    for i in range(num_processes):
        env = process_env(i, num_processes, port, devices_per_process)
        if i == 0:
            procs.append(subprocess.Popen(cmd, env=env, cwd=os.getcwd()))
            logs.append(None)
        else:
            path = log_dir / f"process_{i}.log"
            f = open(path, "w")
            procs.append(subprocess.Popen(cmd, env=env, cwd=os.getcwd(), stdout=f,
                                          stderr=subprocess.STDOUT))
            logs.append(path)
    print(f"titans-lm launch: {num_processes} processes x {devices_per_process or 'default'} devices, "
          f"coordinator 127.0.0.1:{port}, logs of processes 1..{num_processes - 1} in {log_dir}",
          file=out, flush=True)

    if on_start is not None:
        on_start(procs)
    received: list[int] = []

    def forward(signum, frame):
        del frame
        received.append(signum)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)
    in_main = threading.current_thread() is threading.main_thread()
    old = ({s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)} if in_main
           else {})

    def stop_all() -> None:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + grace_s
        for p in procs:
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    start = time.monotonic()
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed and not received:
                i, c = failed[0]
                where = f"; its log ends:\n{_tail(logs[i])}" if logs[i] else ""
                print(f"titans-lm launch: process {i} {_status(c)}; stopping the other "
                      f"processes{where}", file=out, flush=True)
                stop_all()
                return 128 - c if c < 0 else c
            if all(c is not None for c in codes):
                bad = [c for c in codes if c != 0]
                return 0 if not bad else (128 - bad[0] if bad[0] < 0 else bad[0])
            if time.monotonic() - start > timeout_s:
                print(f"titans-lm launch: the run exceeded --timeout_s={timeout_s:g}; stopping every "
                      f"process", file=out, flush=True)
                stop_all()
                return 124
            time.sleep(0.2)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for p in procs:
            if p.poll() is None:
                p.kill()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        cut = argv.index("--")
        own, rest = argv[:cut], argv[cut + 1:]
    else:
        own, rest = argv, []
    ap = argparse.ArgumentParser(prog="titans-lm launch", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num_processes", type=int, default=2)
    ap.add_argument("--devices_per_process", type=int, default=4,
                    help="virtual CPU devices per process (0: leave the device setup alone)")
    ap.add_argument("--command", default="train", choices=["train", "eval"])
    ap.add_argument("--log_dir", default=None)
    ap.add_argument("--timeout_s", type=float, default=3600)
    ap.add_argument("--grace_s", type=float, default=20)
    ap.add_argument("--port", type=int, default=None)
    a = ap.parse_args(own)
    if a.num_processes < 1:
        ap.error("--num_processes must be >= 1")
    return launch(rest, num_processes=a.num_processes, devices_per_process=a.devices_per_process,
                  command=a.command, log_dir=a.log_dir, timeout_s=a.timeout_s, grace_s=a.grace_s,
                  port=a.port)


if __name__ == "__main__":
    sys.exit(main())
