"""kill -9 during a checkpoint save, and SIGTERM, then the same command: the run resumes and
ends with final metrics identical to an uninterrupted run (via scripts/kill_resume.py)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_sigterm_then_kill_during_save_then_rerun_matches_uninterrupted_run():
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "scripts", "kill_resume.py"), "--plan", "term,save",
       "--steps", "30"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True,
      text=True, timeout=600)
  assert result.returncode == 0, result.stdout + result.stderr[-4000:]
  lines = result.stdout.splitlines()
  assert any("SIGTERM -> exit 0" in line for line in lines), result.stdout
  assert any("kill -9 during a save" in line for line in lines), result.stdout
  assert any("final metrics identical to the uninterrupted run" in line for line in lines), (
      result.stdout)
