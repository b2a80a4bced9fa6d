#!/usr/bin/env bash
# Device check of the Pallas memory kernels on a machine with an NVIDIA GPU (e.g. one H200), in
# under 5 minutes:
#   1. install: the wheels in .whl/ if that folder holds any (into /tmp/site, first on
#      PYTHONPATH: e.g. jax/jaxlib/jax-cuda13-plugin 0.10.2 or ml-collections, for an offline
#      machine); JAX for CUDA matching the project's pin from the registry (jax[cuda13]==0.10.2,
#      else jax[cuda12]==0.10.2) unless a GPU-enabled jax 0.10.2 is already there; the project
#      (pip install -e ".[test]", else without dependencies, else PYTHONPATH). Offline, it keeps
#      the machine's own GPU-enabled JAX and says so;
#   2. the kernel tests compiled for the GPU (TITANS_LM_PALLAS_INTERPRET=0: the Triton kernel,
#      not its interpreter) and, when more than 170 s are left, the agreement table;
#   3. the benchmark pallas vs chunked (scripts/benchmark.py pallas: forward and forward+backward
#      tokens/s, T in {16384, 4096, 65536}, d in {128, 64}, chunk in {16, 64}, MLP then linear
#      memory) in the time that is left.
# Results go to $OUT (or /tmp/titans_lm_device_check when OUT is unset): device_check.log,
# env.txt, tests.xml, tests.log, agreement.json, benchmark_pallas.json.
#
#   bash scripts/device_check.sh            # PYTHON=python3.12 to pick the interpreter
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
OUT_DIR="${OUT:-/tmp/titans_lm_device_check}"
mkdir -p "$OUT_DIR"
exec > >(tee "$OUT_DIR/device_check.log") 2>&1
PY="${PYTHON:-python3}"
JAX_VERSION=0.10.2
START=$(date +%s)
DEADLINE=$((START + ${DEVICE_CHECK_SECONDS:-290}))
log() { echo "[device_check +$(( $(date +%s) - START ))s] $*"; }
left() { echo $(( DEADLINE - $(date +%s) )); }
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1

PIP_SOURCE=(--retries 0 --timeout 15)
if compgen -G ".whl/*.whl" > /dev/null; then
  log "installing the wheels in .whl/ into /tmp/site"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi

gpu_jax_version() {
  JAX_PLATFORMS=cuda "$PY" -c "import jax; assert jax.default_backend() == 'gpu'; print(jax.__version__)" 2>/dev/null
}

# ---------------------------------------------------------------------------------- 1. install
have=$(gpu_jax_version || true)
pinned=0
if [ "$have" = "$JAX_VERSION" ]; then
  log "jax $have with a GPU backend is already installed"; pinned=1
else
  log "GPU jax found: '${have:-none}'; installing jax[cuda13|cuda12]==$JAX_VERSION"
  for extra in cuda13 cuda12; do
    if timeout 120 "$PY" -m pip install -q "${PIP_SOURCE[@]}" "jax[$extra]==$JAX_VERSION"; then
      log "installed jax[$extra]==$JAX_VERSION"; pinned=1; break
    fi
    log "jax[$extra]==$JAX_VERSION did not install"
  done
fi
# With the pinned GPU jax in place the project's pinned dependencies can follow; without it they
# would replace the machine's GPU jax by a CPU-only one, so the project goes in without them.
if [ "$pinned" = 1 ] && timeout 90 "$PY" -m pip install -q "${PIP_SOURCE[@]}" --no-build-isolation \
    -e ".[test]"; then
  log "installed the project with its dependencies"
elif timeout 60 "$PY" -m pip install -q --no-deps --no-build-isolation -e .; then
  log "installed the project without dependencies (the machine's own packages serve)"
else
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  log "pip could not install the project; using PYTHONPATH=$PYTHONPATH"
fi
have=$(gpu_jax_version || true)
{
  echo "python: $("$PY" --version 2>&1) at $(command -v "$PY")"
  echo "jax with a GPU backend: ${have:-none}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  "$PY" -m pip list 2>/dev/null | grep -iE "^(jax|jaxlib|jax-cuda|flax|optax|numpy|pytest) " 
} > "$OUT_DIR/env.txt"
cat "$OUT_DIR/env.txt"
if [ -z "$have" ]; then
  log "no GPU-enabled JAX: stopping"
  echo '{"error": "no GPU-enabled jax"}' > "$OUT_DIR/benchmark_pallas.json"
  exit 1
fi
[ "$have" = "$JAX_VERSION" ] || log "WARNING: running under jax $have, not the pinned $JAX_VERSION"
export JAX_PLATFORMS=cuda TITANS_LM_PALLAS_INTERPRET=0

# ---------------------------------------------------------------------------------- 2. tests
log "kernel tests, compiled for the GPU"
timeout $(( $(left) > 260 ? 130 : $(left) / 2 )) "$PY" -m pytest tests/memory/test_pallas.py -v \
  -p no:cacheprovider --durations=10 --junitxml="$OUT_DIR/tests.xml" 2>&1 \
  | tee "$OUT_DIR/tests.log" | grep -E "PASS|FAIL|ERROR|SKIP|passed|failed|s call" | tail -45
log "tests exit status ${PIPESTATUS[0]}"
if [ "$(left)" -gt 170 ]; then
  log "agreement table (compiled Triton kernel vs chunked)"
  timeout 45 "$PY" scripts/agreement.py pallas --compiled --backends triton --json \
    > "$OUT_DIR/agreement.json" 2>&1
  log "agreement exit status $?"; tail -8 "$OUT_DIR/agreement.json"
fi

# ---------------------------------------------------------------------------------- 3. benchmark
budget=$(( $(left) - 50 ))
if [ "$budget" -lt 15 ]; then
  log "no time left for the benchmark"; exit 0
fi
log "benchmark, budget ${budget}s"
timeout $(( budget + 45 )) "$PY" scripts/benchmark.py pallas --budget-s "$budget" \
  --out "$OUT_DIR/benchmark_pallas.json"
log "benchmark exit status $?; done"
