"""Worker processes die with the study that started them.

A ``spawn`` worker of :mod:`.parallel` outlives a parent killed with ``kill -9`` (its pool
cannot tell it to stop), and would go on training and writing checkpoints into ``--out``
without the parent's lock, for ever. :func:`die_with_parent`, called first in every
worker, prevents it twice over:

- on Linux, ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: the kernel kills the worker the moment
  its parent dies;
- everywhere, a daemon thread that polls ``os.getppid()`` against the parent's pid (a
  dead parent's children are handed to another process) and ends the worker when it
  changes; and :func:`~posenc._files.check_parent`, which every atomic write
  (:func:`posenc._files.write_atomically`) calls before it writes and before it renames, so
  an orphaned worker writes nothing more even between two polls.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

from posenc._files import ORPHANED_EXIT, bind_to_parent, check_parent

__all__ = ["check_parent", "die_with_parent"]

_PR_SET_PDEATHSIG = 1


def _set_pdeathsig() -> bool:
    """Ask Linux to SIGKILL this process when its parent dies; whether it took."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)) == 0
    except (OSError, AttributeError):  # no libc prctl (musl without it, a sandbox)
        return False


def _watch(parent: int, interval: float) -> None:
    while True:
        time.sleep(interval)
        if os.getppid() != parent:
            os._exit(ORPHANED_EXIT)


def die_with_parent(parent: int, *, interval: float = 0.1) -> None:
    """Make this process end when the process ``parent`` (its parent's pid, as the parent
    saw it) dies: ``PR_SET_PDEATHSIG`` on Linux, and a thread polling ``os.getppid()``
    every ``interval`` seconds everywhere. A parent already gone ends it now."""
    _set_pdeathsig()
    bind_to_parent(parent)
    check_parent()  # it died before prctl took: nothing would signal us
    thread = threading.Thread(
        target=_watch, args=(parent, interval), name="posenc-parent-watch", daemon=True
    )
    thread.start()
