#!/usr/bin/env bash
# One entry point that sets itself up: creates (or reuses) ./.venv, installs the pinned
# dependencies when requirements.lock / setup.cfg change, then runs the requested job.
#   ./run.sh demo        train two full-attention controls, fixed M=4 and three cures, run the
#                        periodicity sweep, write runs/demo/report.md and plots (13 min 27 s measured
#                        on 2 CPU cores, environment installed; results/demo/RUN.md)
#   ./run.sh test        lint + the whole test suite, notebooks included (what CI runs)
#   ./run.sh python ...  any command inside the environment
set -euo pipefail
cd "$(dirname "$0")"
VENV="${CHUNKFORMER_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"

# ensure_env [LOCK...]: requirements.lock plus the extra locks named (the test job adds
# requirements-test.lock: torch and transformers, the reference for checkpoint import tests).
ensure_env() {
  local stamp="$VENV/.chunkformer-deps" want locks=(requirements.lock "$@") lock
  want="$(cat "${locks[@]}" setup.cfg pyproject.toml | sha256sum | cut -d' ' -f1)"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "[run.sh] installing pinned dependencies into $VENV" >&2
    for lock in "${locks[@]}"; do
      "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$lock"
    done
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
      --no-build-isolation -e .
    echo "$want" > "$stamp"
  fi
}

job="${1:-demo}"
shift || true
if [ "$job" = test ]; then ensure_env requirements-test.lock; else ensure_env; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
case "$job" in
  demo)
    exec "$VENV/bin/python" eval.py --config configs/sweeps/demo.py \
      --workdir "${CHUNKFORMER_WORKDIR:-runs/demo}" "$@" ;;
  test)
    "$VENV/bin/ruff" check chunkformer kernels configs tests bench scripts train.py eval.py
    CHUNKFORMER_FAST=1 exec "$VENV/bin/python" -m pytest -q -n 2 --dist loadfile --durations=15 \
      tests --nbmake notebooks "$@" ;;
  python)
    exec "$VENV/bin/python" "$@" ;;
  *)
    echo "usage: ./run.sh {demo|test|python ...}" >&2; exit 2 ;;
esac
