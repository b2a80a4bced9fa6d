"""Test-session setup.

- 8 virtual CPU devices, so sharding tests can build real meshes.
- A persistent compilation cache per test process: several tests run ``train`` more than once
  with the same configuration (a run, then the same run stopped and resumed), and each call
  builds fresh jitted functions that compile the same programs again; the on-disk cache keyed by
  the program turns those compiles into loads.
- The compiled programs of one test module freed before the next: each XLA:CPU executable holds
  its own memory mappings (the JIT-linked code), and a worker that runs hundreds of tests would
  otherwise keep every one it compiled, reach the kernel's per-process limit on mappings
  (vm.max_map_count, 65,530 by default) and fail the next compile ("LLVM compilation error:
  Cannot allocate memory") or crash.
"""

import gc
import os
import shutil
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _compilation_cache():
    d = tempfile.mkdtemp(prefix="titans-lm-test-xla-")
    jax.config.update("jax_compilation_cache_dir", d)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    yield
    jax.config.update("jax_compilation_cache_dir", None)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs_after_each_module():
    yield
    jax.clear_caches()
    gc.collect()
