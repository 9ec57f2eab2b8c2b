"""One writer per directory: an exclusive lock that the OS drops when its holder dies.

A run directory (training, evaluation of a run, one sweep unit) is locked through the file
``DIR/.chunkformer.lock``; an output directory that is created by a final rename (ingestion)
through the sibling file ``PARENT/.NAME.lock``. The lock is ``fcntl.flock`` on that file, so it
belongs to the open file: it is released when the holder closes it, exits or is killed (kill -9
included), and no stale lock ever needs deleting. The file stays in place (deleting it would
let a second process lock a new file of the same name); it records the holder (pid, host,
start time, what it does) so that a refused process can say who holds the directory.

Locks are reentrant within a process: a sweep unit holds its run directory while training
(which takes the same lock) and evaluating it. flock is advisory and per host on most network
filesystems; processes of one multi-process job share a directory, so only process 0 locks. A
child made by a bare fork (no exec) shares the open file, and so the lock, until it exits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from absl import logging

LOCK_FILE = ".chunkformer.lock"
T = TypeVar("T")

# Real lock path -> [open file descriptor, nesting depth] of the locks this process holds.
_HELD: dict[str, list[int]] = {}


class Locked(RuntimeError):
  """Another process holds the directory; the message is one line naming it and what to do."""

  def __init__(self, message: str, lock_path: str):
    super().__init__(message)
    self.lock_path = lock_path


@dataclasses.dataclass(frozen=True)
class Holder:
  pid: int
  host: str
  since: str  # UTC, "YYYY-MM-DD HH:MM:SS UTC"
  purpose: str

  def describe(self) -> str:
    return f"pid {self.pid} on host {self.host} since {self.since} ({self.purpose})"


def directory_lock(directory: str) -> str:
  """The lock file of a run directory (inside it)."""
  return os.path.join(directory, LOCK_FILE)


def output_lock(output: str) -> str:
  """The lock file of a directory that appears by a rename (beside it, in its parent)."""
  path = os.path.abspath(output).rstrip(os.sep)
  return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.lock")


def read_holder(lock_path: str) -> Holder | None:
  """The holder recorded in ``lock_path`` (None if unreadable or not yet written)."""
  try:
    with open(lock_path, encoding="utf-8") as f:
      return Holder(**json.load(f))
  except (OSError, ValueError, TypeError):
    return None


def _record(fd: int, purpose: str) -> None:
  holder = Holder(os.getpid(), socket.gethostname(),
                  time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), purpose)
  os.ftruncate(fd, 0)
  os.pwrite(fd, json.dumps(dataclasses.asdict(holder)).encode(), 0)


def _refusal(what: str, lock_path: str, advice: str) -> Locked:
  holder = read_holder(lock_path)
  who = holder.describe() if holder else "another process (still starting)"
  stop = f"stop it (kill {holder.pid}) and rerun" if holder else "stop it and rerun"
  return Locked(f"{what} is in use by {who}: {advice or 'wait for it to finish, or ' + stop} "
                f"(lock file {lock_path})", lock_path)


@contextlib.contextmanager
def hold(lock_path: str, purpose: str, *, what: str | None = None, wait: bool = False,
         advice: str = "", reader: bool = False) -> Iterator[bool]:
  """Holds the exclusive lock ``lock_path`` for the ``with`` block; yields whether it is held.

  ``purpose`` (e.g. "training") is recorded for others to read; ``what`` names the directory in
  the refusal. Without ``wait`` a held lock raises ``Locked`` at once (one line: holder, then
  ``advice`` or "wait for it to finish, or stop it and rerun"); with ``wait`` it blocks until the
  holder is gone. A ``reader`` (writes nothing under the lock) proceeds unlocked, yielding
  False, where the lock file cannot be created (a missing or read-only directory has no writer
  to race; the read then fails or succeeds on its own).
  """
  key = os.path.realpath(lock_path)
  if key in _HELD:  # reentrant: this process already holds it
    _HELD[key][1] += 1
    try:
      yield True
    finally:
      _HELD[key][1] -= 1
    return
  fd = _open(key, reader)
  if fd is None:
    yield False
    return
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      if not wait:
        raise _refusal(what or os.path.dirname(key), key, advice) from None
      holder = read_holder(key)
      logging.info("waiting for %s, held by %s", what or os.path.dirname(key),
                   holder.describe() if holder else "another process")
      fcntl.flock(fd, fcntl.LOCK_EX)
    _record(fd, purpose)
    _HELD[key] = [fd, 1]
    try:
      yield True
    finally:
      del _HELD[key]
  finally:
    os.close(fd)  # closing the last descriptor of the open file releases the flock


def _open(key: str, reader: bool) -> int | None:
  try:
    if not reader:  # a reader never creates the directory it reads
      os.makedirs(os.path.dirname(key), exist_ok=True)
    return os.open(key, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
  except OSError as e:
    if not (reader and e.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT)):
      raise
    if e.errno != errno.ENOENT:
      logging.warning("cannot create %s (%s): reading without a lock", key, e.strerror)
    return None


def try_hold(lock_path: str) -> bool:
  """Whether ``lock_path`` is free now (taken and released at once; for tests and tools)."""
  try:
    with hold(lock_path, "probe"):
      return True
  except Locked:
    return False


def each_exclusive(items: Sequence[T], lock_path: Callable[[T], str], purpose: str,
                   work: Callable[[T], None], *, name: Callable[[T], str] = str) -> None:
  """``work(item)`` for every item while holding ``lock_path(item)``, as parallel workers over
  one list want it: an item another process holds is put off until the free ones are done,
  then waited for. ``work`` must check again whether the item still needs doing (the holder
  may have done it)."""
  put_off = []
  for item in items:
    try:
      with hold(lock_path(item), purpose, what=name(item)):
        work(item)
    except Locked as e:
      if e.lock_path != os.path.realpath(lock_path(item)):
        raise  # refused inside ``work`` for another directory
      logging.info("%s; doing the others first", e)
      put_off.append(item)
  for item in put_off:
    with hold(lock_path(item), purpose, what=name(item), wait=True):
      work(item)


def held_by_this_process(lock_path: str) -> bool:
  return os.path.realpath(lock_path) in _HELD

