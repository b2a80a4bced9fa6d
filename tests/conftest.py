"""Test-session setup.

- 8 virtual CPU devices, so sharding tests can build real meshes.
- The compiled programs of one test module freed before the next: each XLA:CPU executable holds
  its own memory mappings (the JIT-linked code), and a worker that runs hundreds of tests would
  otherwise keep every one it compiled, reach the kernel's per-process limit on mappings
  (vm.max_map_count, 65,530 by default) and fail the next compile ("LLVM compilation error:
  Cannot allocate memory") or crash.
- JAX's persistent compilation cache in `.pytest_cache/jax_compilation_cache`, shared by both
  workers and every subprocess a test starts (set through the environment, so children inherit
  it). Many end-to-end tests train one configuration several times (train, resume, train
  again); each call traces a new closure, and without the cache XLA compiled the same program
  again each time. A cache hit returns the executable XLA built for the identical HLO and
  compile options, so results are unchanged. The cache is capped (LRU eviction, which also makes
  JAX lock the directory between processes) and may be deleted at any time;
  `TITANS_LM_TEST_COMPILATION_CACHE=0` turns it off. `TITANS_LM_COMPILE_CACHE` (the CLI's own
  cache, `titans_lm.train.compilation`) names the same folder, or `off`: a test never writes to the
  user's cache under `~/.cache`.
- XLA:CPU's LLVM back end at -O0, and its older (non-MLIR) kernel emitters
  (`TITANS_LM_TEST_COMPILE_FLAGS`, also given to the CLI subprocesses). The suite's programs are
  tiny and run a few steps, so compiling dominates. -O0 is the LLVM code generation's level (the
  tiny LMM train step's memory plan is byte-identical under both). The MLIR fusion emitters
  (XLA:CPU's default) spend about 20 ms per kernel: a one-layer MAG train step has about 800,
  and `--xla_cpu_use_fusion_emitters=false` compiles it in 6 s instead of 20 s. Every
  comparison in the suite is between programs built alike or to a tolerance.
  `TITANS_LM_TEST_COMPILE_FLAGS=""` runs the suite on fully optimised code.
- Two warnings filtered (:data:`EXPECTED_WARNINGS`), both left by a checkpoint restore that fails
  on purpose (a warm start from parameters of another shape,
  tests/train/test_warm_start.py): orbax abandons the array reads still pending, and at garbage
  collection each reports its cancellation (a ~60-line TensorStore spec) or finds its event loop
  closed. Any other unraisable exception is still shown.
"""

import gc
import os
from pathlib import Path

os.environ.setdefault("TITANS_LM_TEST_COMPILE_FLAGS", "--xla_backend_optimization_level=0 "
                      "--xla_cpu_use_fusion_emitters=false")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                      + os.environ["TITANS_LM_TEST_COMPILE_FLAGS"])
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if os.environ.get("TITANS_LM_TEST_COMPILATION_CACHE", "1") != "0":
    _cache = Path(__file__).resolve().parent.parent / ".pytest_cache" / "jax_compilation_cache"
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(_cache))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 << 30))
    os.environ.setdefault("TITANS_LM_COMPILE_CACHE", str(_cache))
else:
    os.environ.setdefault("TITANS_LM_COMPILE_CACHE", "off")

import jax  # noqa: E402
import pytest  # noqa: E402

EXPECTED_WARNINGS = (
    r"ignore:Exception ignored in. <coroutine object _read_array_index_and_device_put"
    r":pytest.PytestUnraisableExceptionWarning",
    r"ignore:Exception ignored in. None\s+Traceback[\s\S]*RuntimeError. Event loop is closed\s*$"
    r":pytest.PytestUnraisableExceptionWarning",
)


def pytest_configure(config):
    for line in EXPECTED_WARNINGS:
        config.addinivalue_line("filterwarnings", line)


@pytest.fixture
def x64():
    """float64 enabled for the test (``jax_enable_x64``), restored afterwards."""
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """``(root, cfg)``: one finished 6-step tiny Transformer++ run in ``root / "run"`` (checkpoints
    at steps 3 and 6; the config of ``tests/_tiny_run.py``, data cache in ``root / "cache"``),
    trained once per worker for the tests that read a finished run (checkpoint faults, evaluation).
    A test that changes the run copies it first (``shutil.copytree``)."""
    from _tiny_run import tiny_config  # only for the tests that use the run
    from titans_lm.train.loop import train  # only for the tests that use the run
    root = tmp_path_factory.mktemp("tiny_run")
    cfg = tiny_config(root / "cache")
    train(cfg, root / "run", progress=False, log=lambda m: None)
    return root, cfg


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs_after_each_module():
    yield
    jax.clear_caches()
    gc.collect()
