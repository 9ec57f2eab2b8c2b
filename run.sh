#!/usr/bin/env bash
# One entry point that sets itself up: creates (or reuses) ./.venv, installs the pinned
# dependencies when requirements.lock / setup.cfg change, then runs the requested job.
#   ./run.sh demo        train the full-attention control, fixed M=4 and the dynamic cure on two
#                        seeds, run the periodicity sweep, decide C1, C2 and C8, write
#                        runs/demo/report.md and plots (its time: results/demo/RUN.md)
#   ./run.sh test        lint + the whole test suite, notebooks included (what CI runs)
#   ./run.sh python ...  any command inside the environment
# Environment:
#   CHUNKFORMER_JAX=cpu|cuda12|tpu|system  which JAX backend to install (default cpu): cuda12
#                        adds requirements-cuda12.lock (NVIDIA GPUs), tpu adds requirements-tpu.lock
#                        (Cloud TPU VMs); switching flavour reinstalls and removes the other's plugin.
#                        system: the JAX of $PYTHON (an accelerator image's own), checked against
#                        the tested range (scripts/system_jax.py); the environment sees the image's
#                        packages and gets only the pins of the locks that the image lacks
#   CHUNKFORMER_VENV     the environment's directory (default ./.venv)
#   CHUNKFORMER_WORKDIR  the demo's directory (default runs/demo)
#   CHUNKFORMER_DEMO_SHARDS  processes the demo trains in (default 2 on CPU, one per core; else 1)
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
  system) FLAVOUR_LOCKS=() ;;
  *) echo "error: CHUNKFORMER_JAX=$FLAVOUR: expected cpu (default), cuda12, tpu or system" >&2
    exit 2 ;;
esac
PLUGINS=(jax-cuda12-plugin jax-cuda12-pjrt libtpu)

job="${1:-demo}"
shift || true
case "$job" in
  demo|test|python) ;;
  *) echo "usage: [CHUNKFORMER_JAX=cpu|cuda12|tpu|system] ./run.sh {demo|test|python ...}" >&2
    exit 2 ;;
esac

# ensure_env [LOCK...]: requirements.lock, the flavour's lock, plus the extra locks named (the test
# job adds requirements-test.lock: torch and transformers, the reference for checkpoint import
# tests). The stamp names the flavour (system: and the image's JAX and what it lacks), so
# switching it reinstalls.
ensure_env() {
  local stamp="$VENV/.chunkformer-deps" want locks=(requirements.lock "${FLAVOUR_LOCKS[@]}" "$@")
  local lock plugin state=installed stale=() system="" need=() shared=false
  if [ "$FLAVOUR" = system ]; then
    # One line "jax=X missing=a==1,b==2" (or "-"), or one error line and exit 2.
    system="$("$PYTHON" scripts/system_jax.py "${locks[@]}")" || exit 2
    [ "${system#*missing=}" = - ] || IFS=, read -r -a need <<< "${system#*missing=}"
    shared=true
  fi
  want="$( (echo "jax flavour: $FLAVOUR $system"; cat "${locks[@]}" setup.cfg pyproject.toml) \
    | sha256sum | cut -d' ' -f1)"
  [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] || state="install due"
  if [ "${CHUNKFORMER_DRY_RUN:-0}" = 1 ]; then
    echo "flavour=$FLAVOUR locks=$(IFS=,; echo "${locks[*]}")${system:+ $system} stamp=$want" \
      "venv=$VENV state=$state"
    exit 0
  fi
  # An environment sees the image's packages exactly when the flavour is system.
  if [ -f "$VENV/pyvenv.cfg" ] && ! grep -qsx "include-system-site-packages = $shared" \
      "$VENV/pyvenv.cfg"; then
    echo "error: $VENV was made for another CHUNKFORMER_JAX (system packages shared:" \
      "$([ $shared = true ] && echo no || echo yes)); remove it or set CHUNKFORMER_VENV" >&2
    exit 2
  fi
  if [ ! -x "$VENV/bin/python" ]; then
    if [ $shared = true ]; then "$PYTHON" -m venv --system-site-packages "$VENV"
    else "$PYTHON" -m venv "$VENV"; fi
  fi
  if [ "$state" != installed ]; then
    echo "[run.sh] installing pinned dependencies ($FLAVOUR JAX) into $VENV" >&2
    if [ "$FLAVOUR" = system ]; then
      # The image's JAX and packages stay; only what it lacks, at the locks' pins.
      [ ${#need[@]} = 0 ] || "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
        "${need[@]}"
    else
      # Another flavour's plugin would still be picked up by JAX: remove what this one lacks.
      for plugin in "${PLUGINS[@]}"; do
        grep -qs "^$plugin==" "${locks[@]}" || stale+=("$plugin")
      done
      "$VENV/bin/python" -m pip uninstall -q -y "${stale[@]}" >/dev/null 2>&1 || true
      for lock in "${locks[@]}"; do
        "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$lock"
      done
    fi
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
      --no-build-isolation -e .
    echo "$want" > "$stamp"
  fi
}

if [ "$job" = test ]; then ensure_env requirements-test.lock; else ensure_env; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
case "$job" in
  demo)
    # On CPU two shards of the sweep in parallel, each XLA single-threaded on its own core (a
    # model this small trains faster per core than on two threads); the shard that finds every
    # unit trained writes the report. CHUNKFORMER_DEMO_SHARDS overrides the count.
    shards="${CHUNKFORMER_DEMO_SHARDS:-$([ "$FLAVOUR" = cpu ] && echo 2 || echo 1)}"
    if [ "$shards" = 1 ]; then
      exec "$VENV/bin/python" eval.py --config configs/sweeps/demo.py \
        --workdir "${CHUNKFORMER_WORKDIR:-runs/demo}" "$@"
    fi
    pids=()
    for ((i = 0; i < shards; i++)); do
      XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \
        "$VENV/bin/python" eval.py --config configs/sweeps/demo.py \
        --workdir "${CHUNKFORMER_WORKDIR:-runs/demo}" --shard "$i/$shards" "$@" &
      pids+=("$!")
    done
    status=0
    for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
    exit "$status" ;;
  test)
    "$VENV/bin/python" -m ruff check chunkformer kernels configs tests bench scripts train.py eval.py
    # Test workers share the accelerator: on a GPU each allocates as it goes (not 75% up front);
    # a TPU is opened by one process only.
    workers=2
    if [ "$FLAVOUR" = cuda12 ] || [ "$FLAVOUR" = system ]; then
      export XLA_PYTHON_CLIENT_PREALLOCATE="${XLA_PYTHON_CLIENT_PREALLOCATE:-false}"
    elif [ "$FLAVOUR" = tpu ]; then
      workers=1
    fi
    CHUNKFORMER_FAST=1 exec "$VENV/bin/python" -m pytest -q -n "$workers" --dist loadfile \
      --durations=15 tests --nbmake notebooks "$@" ;;
  python)
    exec "$VENV/bin/python" "$@" ;;
esac
