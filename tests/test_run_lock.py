"""The run lock (chunkformer/run_lock.py) between real processes: one holder, a one-line refusal
naming it, release by the OS when the holder is killed, reentrancy, and the put-off-then-wait
order of parallel workers. No JAX: each helper process imports only the lock."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from chunkformer import run_lock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT)
HOLD = ("import sys, time\nfrom chunkformer import run_lock\n"
        "with run_lock.hold(sys.argv[1], 'holding for a test'):\n"
        "  print('held', flush=True)\n  time.sleep(float(sys.argv[2]))\n")
TAKE = ("import sys\nfrom chunkformer import run_lock\n"
        "try:\n  with run_lock.hold(sys.argv[1], 'second', what='the test directory'):\n"
        "    print('took it')\nexcept run_lock.Locked as e:\n  sys.exit(f'error: {e}')\n")


def _holder(lock_path: str, seconds: float) -> subprocess.Popen:
  proc = subprocess.Popen([sys.executable, "-c", HOLD, lock_path, str(seconds)], cwd=ROOT,
                          env=ENV, stdout=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == "held"
  return proc


def test_second_process_is_refused_at_once_in_one_line_naming_the_holder(tmp_path):
  path = run_lock.directory_lock(str(tmp_path / "run"))
  with run_lock.hold(path, "training"):
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", TAKE, path], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=60)
    waited = time.monotonic() - began
  lines = done.stderr.strip().splitlines()
  assert done.returncode == 1 and len(lines) == 1, done.stderr
  assert lines[0].startswith(f"error: the test directory is in use by pid {os.getpid()} on host "
                             f"{socket.gethostname()} since 20"), lines[0]
  assert "(training): wait for it to finish, or stop it (kill " in lines[0]
  assert waited < 30  # refused, not queued (the time is the interpreter's start)
  again = subprocess.run([sys.executable, "-c", TAKE, path], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=60)
  assert again.returncode == 0 and again.stdout.strip() == "took it"  # released with the block


def test_kill_9_of_the_holder_frees_the_lock(tmp_path):
  path = run_lock.directory_lock(str(tmp_path / "run"))
  proc = _holder(path, 120)
  try:
    assert not run_lock.try_hold(path)
    holder = run_lock.read_holder(path)
    assert holder.pid == proc.pid and holder.purpose == "holding for a test"
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  assert run_lock.try_hold(path)  # the OS dropped it with the process; the file stays
  assert os.path.exists(path)


def test_lock_is_reentrant_within_a_process_and_released_by_the_outermost_block(tmp_path):
  path = run_lock.directory_lock(str(tmp_path / "run"))
  with run_lock.hold(path, "sweep unit"):
    with run_lock.hold(path, "training"):  # the trainer inside a sweep unit
      pass
    assert run_lock.held_by_this_process(path)
    assert run_lock.read_holder(path).purpose == "sweep unit"
  assert not run_lock.held_by_this_process(path)
  done = subprocess.run([sys.executable, "-c", TAKE, path], cwd=ROOT, env=ENV,
                        capture_output=True, text=True, timeout=60)
  assert done.returncode == 0, done.stderr


def test_workers_do_the_free_items_first_then_wait_for_the_held_one(tmp_path):
  paths = {name: str(tmp_path / f"{name}.lock") for name in "abc"}
  began = time.monotonic()
  proc = _holder(paths["b"], 2.0)  # another worker is on b for two seconds
  order = []

  def work(name):
    order.append((name, run_lock.held_by_this_process(paths[name]), time.monotonic() - began))

  run_lock.each_exclusive(list("abc"), paths.__getitem__, "test", work)
  proc.wait()
  assert [name for name, _, _ in order] == ["a", "c", "b"]
  assert all(held for _, held, _ in order)
  assert order[1][2] < 2.0 <= order[2][2]  # a, c at once; b only after its holder let go


def test_a_refusal_inside_the_work_is_not_mistaken_for_a_held_item(tmp_path):
  other = str(tmp_path / "other.lock")
  proc = _holder(other, 60)
  try:
    def work(_):
      with run_lock.hold(other, "inner"):
        pass

    with pytest.raises(run_lock.Locked, match="other.lock"):
      run_lock.each_exclusive(["x"], lambda _: str(tmp_path / "x.lock"), "test", work)
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_a_reader_creates_no_missing_directory(tmp_path):
  missing = tmp_path / "no_such_run"
  with run_lock.hold(run_lock.directory_lock(str(missing)), "evaluation", reader=True) as held:
    assert held is False
  assert not missing.exists()


def test_output_lock_lies_beside_the_directory_it_guards(tmp_path):
  assert run_lock.output_lock(str(tmp_path / "data") + "/") == str(tmp_path / ".data.lock")
