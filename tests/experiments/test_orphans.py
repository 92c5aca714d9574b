"""Workers die with their study: ``kill -9`` of ``posenc lengthgen --jobs 2`` leaves no
worker alive, and no checkpoint is written after the kill (real processes, Linux)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc to find the workers"
)

#: A study that trains for much longer than the test waits, checkpointing every step.
ARGS = (
    "lengthgen --task copy --encodings none,rope --train-len 8 --eval-lens 8 --steps 1000000 "
    "--batch-size 2 --dim 8 --layers 1 --heads 2 --eval-examples 2 --extend none "
    "--finetune-steps 0 --checkpoint-every 1 --jobs 2 --threads 1 --no-plot --quiet"
).split()


def _stat(pid: int) -> tuple[str, int] | None:
    """``(state, parent pid)`` of ``pid``, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = text[text.rindex(")") + 2 :].split()[:2]
    return state, int(ppid)


def _alive(pid: int) -> bool:
    found = _stat(pid)
    return found is not None and found[0] not in ("Z", "X")  # a zombie has stopped


def _workers(parent: int) -> list[int]:
    """The spawn workers among ``parent``'s children (not its resource tracker)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or (_stat(int(entry)) or ("", 0))[1] != parent:
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
            found.append(int(entry))
    return found


def _wait(what: str, until: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not until():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {seconds} s")
        time.sleep(0.05)


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_kill_9_of_the_study_ends_its_workers_and_their_writes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    ckpts = out / "checkpoints"
    script = Path(sys.executable).parent / "posenc"
    parent = subprocess.Popen(
        [str(script), *ARGS, "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    workers: list[int] = []
    try:

        def training() -> bool:  # both workers up, and both units checkpointing
            assert parent.poll() is None, parent.stderr.read().decode() if parent.stderr else ""
            workers[:] = _workers(parent.pid)
            names = {p.name for p in ckpts.glob("*.pt")} if ckpts.is_dir() else set()
            return len(workers) == 2 and names == {"none.pt", "rope.pt"}

        _wait("the two workers writing checkpoints", training, 90)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        killed = time.time()
        _wait("the workers gone after the kill", lambda: not any(map(_alive, workers)), 5)
        time.sleep(1.0)  # a worker left running would have written a checkpoint by now
        late = {
            p.name: p.stat().st_mtime - killed
            for p in ckpts.iterdir()
            if p.stat().st_mtime > killed + 0.05
        }
        assert not late, f"written after the kill (seconds after it): {late}"
    finally:
        _kill_all([parent.pid, *workers])
        parent.wait(10)


def test_the_watcher_alone_ends_an_orphan(tmp_path: Path) -> None:
    """The portable fallback (no PR_SET_PDEATHSIG): a process whose parent dies is ended by
    its watcher thread within a poll or two."""
    child = tmp_path / "child.pid"
    program = textwrap.dedent(
        f"""
        import subprocess, sys, time
        code = (
            "import os, sys, time\\n"
            "from posenc.experiments import orphans\\n"
            "orphans._set_pdeathsig = lambda: False\\n"  # the fallback only
            "orphans.die_with_parent(os.getppid(), interval=0.05)\\n"
            "open({str(child)!r}, 'w').write(str(os.getpid()))\\n"
            "time.sleep(120)\\n"
        )
        subprocess.Popen([sys.executable, "-c", code])
        time.sleep(120)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", program])
    pid = 0
    try:
        _wait("the child started", lambda: child.exists() and child.read_text() != "", 60)
        pid = int(child.read_text())
        assert _alive(pid)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        _wait("the orphan ended by its watcher", lambda: not _alive(pid), 5)
    finally:
        _kill_all([parent.pid, *([pid] if pid else [])])
        parent.wait(10)
