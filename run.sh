#!/usr/bin/env bash
# One entry point that sets itself up: creates (or reuses) ./.venv, installs the pinned
# dependencies when requirements.lock / setup.cfg change, then runs the requested job.
#   ./run.sh demo        train two full-attention controls, fixed M=4 and three cures, run the
#                        periodicity sweep, write runs/demo/report.md and plots (13 min 27 s measured
#                        on 2 CPU cores, environment installed; results/demo/RUN.md)
#   ./run.sh test        lint + the whole test suite, notebooks included (what CI runs)
#   ./run.sh python ...  any command inside the environment
# Environment:
#   CHUNKFORMER_JAX=cpu|cuda12|tpu  which JAX backend to install (default cpu): cuda12 adds
#                        requirements-cuda12.lock (NVIDIA GPUs), tpu adds requirements-tpu.lock
#                        (Cloud TPU VMs); switching flavour reinstalls and removes the other's plugin
#   CHUNKFORMER_VENV     the environment's directory (default ./.venv)
#   CHUNKFORMER_DRY_RUN=1  print the flavour, lock files and whether an install is due; change nothing
set -euo pipefail
cd "$(dirname "$0")"
VENV="${CHUNKFORMER_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
FLAVOUR="${CHUNKFORMER_JAX:-cpu}"

# The JAX flavour's extra lock and the accelerator plugins it installs (removed when switching).
case "$FLAVOUR" in
  cpu) FLAVOUR_LOCKS=() ;;
  cuda12) FLAVOUR_LOCKS=(requirements-cuda12.lock) ;;
  tpu) FLAVOUR_LOCKS=(requirements-tpu.lock) ;;
  *) echo "error: CHUNKFORMER_JAX=$FLAVOUR: expected cpu (default), cuda12 or tpu" >&2; exit 2 ;;
esac
PLUGINS=(jax-cuda12-plugin jax-cuda12-pjrt libtpu)

job="${1:-demo}"
shift || true
case "$job" in
  demo|test|python) ;;
  *) echo "usage: [CHUNKFORMER_JAX=cpu|cuda12|tpu] ./run.sh {demo|test|python ...}" >&2; exit 2 ;;
esac

# ensure_env [LOCK...]: requirements.lock, the flavour's lock, plus the extra locks named (the test
# job adds requirements-test.lock: torch and transformers, the reference for checkpoint import
# tests). The stamp names the flavour, so switching it reinstalls.
ensure_env() {
  local stamp="$VENV/.chunkformer-deps" want locks=(requirements.lock "${FLAVOUR_LOCKS[@]}" "$@")
  local lock plugin state=installed stale=()
  want="$( (echo "jax flavour: $FLAVOUR"; cat "${locks[@]}" setup.cfg pyproject.toml) \
    | sha256sum | cut -d' ' -f1)"
  [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] || state="install due"
  if [ "${CHUNKFORMER_DRY_RUN:-0}" = 1 ]; then
    echo "flavour=$FLAVOUR locks=$(IFS=,; echo "${locks[*]}") stamp=$want venv=$VENV state=$state"
    exit 0
  fi
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  if [ "$state" != installed ]; then
    echo "[run.sh] installing pinned dependencies ($FLAVOUR JAX) into $VENV" >&2
    # Another flavour's plugin would still be picked up by JAX: remove what this one lacks.
    for plugin in "${PLUGINS[@]}"; do
      grep -qs "^$plugin==" "${locks[@]}" || stale+=("$plugin")
    done
    "$VENV/bin/python" -m pip uninstall -q -y "${stale[@]}" >/dev/null 2>&1 || true
    for lock in "${locks[@]}"; do
      "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$lock"
    done
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
      --no-build-isolation -e .
    echo "$want" > "$stamp"
  fi
}

if [ "$job" = test ]; then ensure_env requirements-test.lock; else ensure_env; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
case "$job" in
  demo)
    exec "$VENV/bin/python" eval.py --config configs/sweeps/demo.py \
      --workdir "${CHUNKFORMER_WORKDIR:-runs/demo}" "$@" ;;
  test)
    "$VENV/bin/ruff" check chunkformer kernels configs tests bench scripts train.py eval.py
    # Test workers share the accelerator: on a GPU each allocates as it goes (not 75% up front);
    # a TPU is opened by one process only.
    workers=2
    if [ "$FLAVOUR" = cuda12 ]; then
      export XLA_PYTHON_CLIENT_PREALLOCATE="${XLA_PYTHON_CLIENT_PREALLOCATE:-false}"
    elif [ "$FLAVOUR" = tpu ]; then
      workers=1
    fi
    CHUNKFORMER_FAST=1 exec "$VENV/bin/python" -m pytest -q -n "$workers" --dist loadfile \
      --durations=15 tests --nbmake notebooks "$@" ;;
  python)
    exec "$VENV/bin/python" "$@" ;;
esac
