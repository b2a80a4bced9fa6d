"""Test-session setup.

- 8 virtual CPU devices, so sharding tests can build real meshes.
- The compiled programs of one test module freed before the next: each XLA:CPU executable holds
  its own memory mappings (the JIT-linked code), and a worker that runs hundreds of tests would
  otherwise keep every one it compiled, reach the kernel's per-process limit on mappings
  (vm.max_map_count, 65,530 by default) and fail the next compile ("LLVM compilation error:
  Cannot allocate memory") or crash.
"""

import gc
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs_after_each_module():
    yield
    jax.clear_caches()
    gc.collect()
