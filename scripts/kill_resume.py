"""kill -9 robustness: interrupted training runs, rerun with the same command, end where an
uninterrupted run ends (identical final_metrics.json).

  python scripts/kill_resume.py                       # random interruptions, 3 trials
  python scripts/kill_resume.py --plan term,save      # one trial: SIGTERM, then kill -9 mid-save

An interruption is one of
  save    kill -9 while a checkpoint is being written (an Orbax temporary directory exists),
  random  kill -9 at a uniformly random moment of the run,
  term    SIGTERM after the first checkpoint: the run must save and exit with status 0.
Each trial applies its interruptions to successive reruns of the same ``train.py`` command,
then reruns it once more to completion. Prints one line per event; exit status 1 on mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ("save", "random", "term")


def command(workdir: str, steps: int) -> list[str]:
  return [sys.executable, os.path.join(ROOT, "train.py"), "--config",
          os.path.join(ROOT, "configs", "smoke.py"), "--workdir", workdir,
          f"--config.train.steps={steps}", "--config.train.checkpoint_every=5",
          "--config.train.log_every=10", "--config.train.eval_every=20"]


def _start(workdir: str, steps: int, log_path: str) -> subprocess.Popen:
  log = open(log_path, "a")  # noqa: SIM115 -- the child owns it until it exits
  return subprocess.Popen(command(workdir, steps), stdout=log, stderr=log, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT))


def _saving(checkpoints: str) -> bool:
  try:
    return any("orbax-checkpoint-tmp" in name for name in os.listdir(checkpoints))
  except FileNotFoundError:
    return False


def _wait_for(predicate, proc: subprocess.Popen, timeout_s: float) -> bool:
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline and proc.poll() is None:
    if predicate():
      return True
    time.sleep(0.001)
  return False


def interrupt(kind: str, workdir: str, steps: int, log_path: str, duration_s: float,
              rng: random.Random) -> str:
  """Runs the command once and interrupts it; returns what happened."""
  checkpoints = os.path.join(workdir, "checkpoints")
  proc = _start(workdir, steps, log_path)
  if kind == "save":
    hit = _wait_for(lambda: _saving(checkpoints), proc, duration_s * 3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    during = hit and _saving(checkpoints)
    return f"kill -9 {'during a save' if during else 'before any save was seen'}"
  if kind == "random":
    delay = rng.uniform(0.0, duration_s)
    _wait_for(lambda: False, proc, delay)
    alive = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return f"kill -9 after {delay:.2f}s ({'running' if alive else 'had already finished'})"
  _wait_for(lambda: any(n.isdigit() for n in _listdir(checkpoints)), proc, duration_s * 3)
  proc.send_signal(signal.SIGTERM)
  rc = proc.wait()
  if rc != 0:
    raise RuntimeError(f"SIGTERM: exit status {rc}, expected 0 (log: {log_path})")
  return f"SIGTERM -> exit 0, checkpoints {sorted(_listdir(checkpoints), key=_step_key)}"


def _listdir(path: str) -> list[str]:
  return os.listdir(path) if os.path.isdir(path) else []


def _step_key(name: str):
  return (0, int(name)) if name.isdigit() else (1, name)


def complete(workdir: str, steps: int, log_path: str) -> dict:
  proc = _start(workdir, steps, log_path)
  if proc.wait() != 0:
    raise RuntimeError(f"run failed, see {log_path}")
  with open(os.path.join(workdir, "final_metrics.json")) as f:
    return json.load(f)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--plan", action="append", default=[],
                      help="comma-separated interruptions for one trial (repeatable)")
  parser.add_argument("--trials", type=int, default=3, help="random trials if no --plan")
  parser.add_argument("--steps", type=int, default=60)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--keep", action="store_true", help="keep the work directories")
  args = parser.parse_args()
  rng = random.Random(args.seed)
  plans = [p.split(",") for p in args.plan] or [
      rng.sample(KINDS, k=rng.randint(1, len(KINDS))) for _ in range(args.trials)]
  for plan in plans:
    for kind in plan:
      if kind not in KINDS:
        parser.error(f"unknown interruption {kind!r}; known: {', '.join(KINDS)}")

  base = tempfile.mkdtemp(prefix="kill_resume_")
  # Shared compilation cache: reruns then restart in about the time of a Python import.
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(base, "jax_cache"))
  began = time.monotonic()
  reference = complete(os.path.join(base, "reference"), args.steps,
                       os.path.join(base, "reference.log"))
  duration_s = time.monotonic() - began
  print(f"uninterrupted run: {duration_s:.1f}s, held-out {reference['heldout']}", flush=True)
  failures = 0
  if any("random" in plan for plan in plans):
    # Random kill times must fall within a run whose programs are already cached.
    began = time.monotonic()
    repeat = complete(os.path.join(base, "repeat"), args.steps, os.path.join(base, "repeat.log"))
    duration_s = time.monotonic() - began
    failures = int(repeat != reference)
    print(f"repeated uninterrupted run (compiled programs cached): {duration_s:.1f}s, final "
          f"metrics {'DIFFER' if failures else 'identical'}", flush=True)
  for i, plan in enumerate(plans):
    workdir, log_path = os.path.join(base, f"trial{i}"), os.path.join(base, f"trial{i}.log")
    for kind in plan:
      print(f"trial {i}: {interrupt(kind, workdir, args.steps, log_path, duration_s, rng)}",
            flush=True)
    final = complete(workdir, args.steps, log_path)
    same = final == reference
    failures += not same
    print(f"trial {i}: rerun to the end -> final metrics "
          f"{'identical to' if same else 'DIFFER from'} the uninterrupted run", flush=True)
  if args.keep or failures:
    print(f"work directories and logs kept in {base}")
  else:
    shutil.rmtree(base)
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
