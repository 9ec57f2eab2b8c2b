"""One writer per directory, between real processes: two trainers on one workdir, kill -9 of
the holder, a stale half-written checkpoint, two sweep processes racing for one unit, two
ingestions of one output (chunkformer/run_lock.py and its users)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from chunkformer import heldout, run_lock, trainer
from chunkformer.config import from_dict
from chunkformer.data import code
from configs import smoke

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT)
TMP = ".orbax-checkpoint-tmp"  # Orbax's mark of a save in progress (or never finished)


def _train_command(workdir: str, steps: int) -> list[str]:
  return [sys.executable, "train.py", "--config", "configs/smoke.py", "--workdir", workdir,
          f"--config.train.steps={steps}", "--config.train.checkpoint_every=5",
          "--config.train.log_every=50", "--config.train.eval_every=1000"]


def _wait(predicate, proc: subprocess.Popen, timeout_s: float) -> bool:
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline and proc.poll() is None:
    if predicate():
      return True
    time.sleep(0.01)
  return predicate()


def _holds(lock_path: str, proc: subprocess.Popen) -> bool:
  holder = run_lock.read_holder(lock_path)
  return holder is not None and holder.pid == proc.pid


def _run(command: list[str], timeout_s: float = 300) -> subprocess.CompletedProcess:
  return subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True,
                        timeout=timeout_s)


def test_two_trainers_one_refused_at_once_kill_9_frees_the_workdir_and_reruns_resume(tmp_path):
  workdir, steps = str(tmp_path / "run"), 200
  lock = run_lock.directory_lock(workdir)
  checkpoints = os.path.join(workdir, "checkpoints")
  first = subprocess.Popen(_train_command(workdir, steps), cwd=ROOT, env=ENV,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    assert _wait(lambda: _holds(lock, first), first, 240), "the first trainer never took the lock"
    second = _run(_train_command(workdir, steps))
    lines = second.stderr.strip().splitlines()
    assert second.returncode == 1 and len(lines) == 1, second.stderr[-3000:]
    assert lines[0].startswith(f"error: workdir {workdir!r} is in use by pid {first.pid} on "
                               "host "), lines[0]
    assert "(training)" in lines[0] and f"kill {first.pid}" in lines[0]
    # kill -9 once the first has saved a checkpoint, while it still trains
    assert _wait(lambda: any(n.isdigit() for n in _listdir(checkpoints)), first, 240)
    assert first.poll() is None, "the first trainer finished before it could be killed"
  finally:
    first.send_signal(signal.SIGKILL)
    first.wait()
  assert not os.path.exists(os.path.join(workdir, "final_metrics.json"))
  third = _run(_train_command(workdir, steps))  # proceeds at once: the OS freed the lock
  assert third.returncode == 0, third.stderr[-3000:]
  resumed = [line for line in third.stderr.splitlines() if "resuming" in line]
  assert resumed and int(resumed[0].rsplit(" ", 1)[1]) > 0, third.stderr[-3000:]
  with open(os.path.join(workdir, "final_metrics.json")) as f:
    final = json.load(f)
  assert final["step"] == steps
  fourth = _run(_train_command(workdir, steps))  # a finished run: reports it, trains nothing
  assert fourth.returncode == 0, fourth.stderr[-3000:]
  assert f"from step {steps}" in fourth.stderr
  with open(os.path.join(workdir, "final_metrics.json")) as f:
    assert json.load(f) == final


def _listdir(path: str) -> list[str]:
  return os.listdir(path) if os.path.isdir(path) else []


def test_a_stale_half_written_checkpoint_is_removed_and_the_run_resumes_from_the_newest(
    tmp_path):
  config = from_dict(smoke.get_config().to_dict())  # 6 steps, checkpoints every 2, keep 2
  reference = trainer.train(config, str(tmp_path / "reference"))
  workdir = str(tmp_path / "run")
  trainer.train(config, workdir)
  checkpoints = os.path.join(workdir, "checkpoints")
  assert sorted(os.listdir(checkpoints)) == ["4", "6"]
  # As a process killed while saving step 6 leaves it: a temporary directory, partly written.
  partial = os.path.join(checkpoints, "6" + TMP)
  shutil.move(os.path.join(checkpoints, "6"), partial)
  shutil.rmtree(os.path.join(partial, next(n for n in sorted(os.listdir(partial))
                                           if os.path.isdir(os.path.join(partial, n)))))
  os.makedirs(os.path.join(checkpoints, "8" + TMP + "-1796285870"))
  os.remove(os.path.join(workdir, "final_metrics.json"))
  seen = []
  final = trainer.train(config, workdir, progress=lambda p: seen.append((p.split, p.step)))
  assert ("train", 2) not in seen and ("train", 6) in seen  # resumed from step 4
  assert final == reference
  assert sorted(os.listdir(checkpoints)) == ["4", "6"]  # no temporary directory left


HOLD = ("import sys, time\nfrom chunkformer import run_lock\n"
        "with run_lock.hold(sys.argv[1], 'training'):\n"
        "  print('held', flush=True)\n  time.sleep(600)\n")


def test_evaluating_a_run_another_process_holds_is_refused_unless_unfinished_is_allowed(
    tmp_path):
  workdir = str(tmp_path / "run")
  trainer.train(from_dict(smoke.get_config().to_dict()), workdir)
  holder = subprocess.Popen([sys.executable, "-c", HOLD, run_lock.directory_lock(workdir)],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(run_lock.Locked, match=rf"^workdir {workdir!r} is in use by pid "
                       rf"{holder.pid} .*\(training\): wait for it to finish, or pass "
                       "--allow_unfinished"):
      heldout.evaluate_checkpoint(workdir)
    peek = heldout.evaluate_checkpoint(workdir, allow_unfinished=True)  # reads, unlocked
  finally:
    holder.kill()
    holder.wait()
    holder.stdout.close()
  assert peek["step"] == 6 and peek["finished"]
  assert heldout.evaluate_checkpoint(workdir) == peek  # the holder is gone: read under the lock


SWEEP = '''
from configs.sweeps import sweep_config, variant


def get_config():
  return sweep_config(
      {"smoke": variant("configs/smoke.py", {"train.steps": STEPS, "train.checkpoint_every": 50,
                                             "data.num_queries": 1})},
      name="tiny", num_offsets=12, num_haystacks=3, depths=(0.0, 1.0), prefix_prompts=2,
      prefix_max=8, slot_gain_rows=8, eval_batch_size=8, num_resamples=50,
      num_permutations=50)
'''


def test_two_sweep_processes_racing_for_one_unit_both_finish_and_train_it_once(tmp_path):
  config = tmp_path / "tiny_sweep.py"
  config.write_text(SWEEP.replace("STEPS", "20"))
  workdir = str(tmp_path / "sweep")
  command = [sys.executable, "eval.py", "--config", str(config), "--workdir", workdir]
  logs = [open(tmp_path / f"sweep{i}.log", "w+") for i in range(2)]  # noqa: SIM115
  first = subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=logs[0], stderr=logs[0])
  refused = f"sweep unit 'smoke' is in use by pid {first.pid}"
  unit_lock = run_lock.directory_lock(os.path.join(workdir, "smoke"))
  try:
    assert _wait(lambda: _holds(unit_lock, first), first, 240), "the unit was never locked"
    # The first is stopped while it holds the unit (its lock stays held) until the second has
    # been refused it: the race is decided the same way however slowly the second starts.
    first.send_signal(signal.SIGSTOP)
    second = subprocess.Popen(command + ["--shard", "0/1"], cwd=ROOT, env=ENV, stdout=logs[1],
                              stderr=logs[1])
    assert _wait(lambda: refused in _read(logs[1]), second, 240), _read(logs[1])[-3000:]
    first.send_signal(signal.SIGCONT)
    codes = [first.wait(timeout=600), second.wait(timeout=600)]
  finally:
    for proc in (first, locals().get("second")):
      if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
  texts = [_read(log) for log in logs]
  for log in logs:
    log.close()
  assert codes == [0, 0], texts[1][-3000:] + texts[0][-3000:]
  assert sum(t.count("[sweep tiny] training 1/1 'smoke' (") for t in texts) == 1
  assert sum(t.count("[sweep tiny] evaluating 1/1 'smoke'") for t in texts) == 1
  assert refused in texts[1], texts[1][-3000:]
  events = [n for n in os.listdir(os.path.join(workdir, "smoke")) if n.startswith("events.")]
  assert len(events) == 1  # one training process ever wrote to the unit
  assert os.path.exists(os.path.join(workdir, "results.json"))


def _read(log) -> str:
  with open(log.name) as f:
    return f.read()


def _ingest_command(corpus: str, output: str) -> list[str]:
  return [sys.executable, "-m", "chunkformer.data.ingest", "--input", f"{corpus}/*.txt",
          "--tokenizer", "bytes", "--output", output, "--heldout_fraction", "0.5"]


@pytest.fixture
def corpus(tmp_path):
  directory = tmp_path / "corpus"
  directory.mkdir()
  for i in range(40):
    (directory / f"doc{i}.txt").write_text(f"document {i}\n" * 50)
  return str(directory)


def test_ingest_into_a_held_output_is_refused_in_one_line_and_writes_nothing(tmp_path, corpus):
  output = str(tmp_path / "data")
  with run_lock.hold(run_lock.output_lock(output), "ingestion"):
    done = _run(_ingest_command(corpus, output), 120)
  lines = done.stderr.strip().splitlines()
  assert done.returncode == 1 and len(lines) == 1, done.stderr
  assert lines[0].startswith(f"error: --output {output!r} is in use by pid {os.getpid()} "), lines
  assert sorted(os.listdir(tmp_path)) == [".data.lock", "corpus"]  # no output, no staging
  again = _run(_ingest_command(corpus, output), 120)  # the holder is gone
  assert again.returncode == 0, again.stderr


def test_two_ingests_racing_for_one_output_write_it_once(tmp_path, corpus):
  output = str(tmp_path / "data")
  procs = [subprocess.Popen(_ingest_command(corpus, output), cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for _ in range(2)]
  results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
  for p in procs:
    p.stdout.close()
    p.stderr.close()
  assert sorted(rc for rc, _ in results) == [0, 1], results
  refusal = next(err for rc, err in results if rc == 1).strip().splitlines()[-1]
  assert (" is in use by pid " in refusal or "exists; pass --overwrite" in refusal), refusal
  with open(os.path.join(output, "manifest.json")) as f:
    manifest = json.load(f)
  held = sum(code.is_heldout(f"doc{i}.txt", 0.5) for i in range(40))
  assert manifest["splits"]["heldout"]["documents"] == held
  assert manifest["splits"]["train"]["documents"] == 40 - held
  assert sorted(os.listdir(tmp_path)) == [".data.lock", "corpus", "data"]  # no staging left
