"""One run per --out: the lock, its takeover after a dead owner, stale temporary files, and
a real ``kill -9`` of ``posenc lengthgen`` resumed to the same weights bit for bit."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from posenc import PosEncError
from posenc._files import LOCK_NAME, lock_out_dir
from posenc.cli import main
from posenc.experiments import run_study

from .tiny import tiny_study

#: the study of ARGV (at 3 steps)
STUDY = tiny_study(
    "copy",
    ["none"],
    train_len=8,
    eval_lens=[8],
    batch_size=2,
    dim=8,
    num_heads=1,
    eval_examples=4,
    warmup=0,
)
ARGV = (
    "lengthgen --task copy --encodings none --train-len 8 --eval-lens 8 --batch-size 2 "
    "--dim 8 --layers 1 --heads 1 --eval-examples 4 --warmup 0 --extend none "
    "--finetune-steps 0 --quiet --no-plot"
).split()


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    return info.value.code, capsys.readouterr().err


def test_a_second_run_into_the_same_out_is_refused(tmp_path: Path, capsys) -> None:
    with lock_out_dir(tmp_path):
        with pytest.raises(PosEncError, match=r"is in use by another posenc run \(pid \d+"):
            run_study(STUDY, out_dir=tmp_path, plot=False)
        code, err = _cli([*ARGV, "--steps", "2", "--out", str(tmp_path)], capsys)
        assert code == 2 and err.count("\n") == 1
        assert "is in use by another posenc run" in err and "use another --out" in err
    assert not (tmp_path / "checkpoints").exists()  # nothing trained
    run_study(STUDY, out_dir=tmp_path, plot=False)  # released: it runs
    assert not (tmp_path / LOCK_NAME).exists()  # and cleans up after itself


HOLDER = textwrap.dedent(
    """
    import sys, time
    from posenc._files import lock_out_dir
    with lock_out_dir(sys.argv[1]):
        print("locked", flush=True)
        time.sleep(120)
    """
)


def test_a_lock_whose_process_is_gone_is_taken_over(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(PosEncError, match=rf"in use by another posenc run \(pid {holder.pid}"):
            run_study(STUDY, out_dir=tmp_path, plot=False)
    finally:
        holder.send_signal(signal.SIGKILL)  # no clean-up: the lock file stays behind
        holder.wait(timeout=30)
    assert f"pid {holder.pid}" in (tmp_path / LOCK_NAME).read_text()
    results = run_study(STUDY, out_dir=tmp_path, plot=False)
    assert results["runs"][0]["train"]["steps"] == 3


def test_a_lock_file_of_junk_is_taken_over(tmp_path: Path) -> None:
    (tmp_path / LOCK_NAME).write_bytes(b"\xff\x00 not a pid")
    run_study(STUDY, out_dir=tmp_path, plot=False)


def test_stale_temporary_files_are_cleaned_on_the_next_run(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir(parents=True)
    stale = [
        tmp_path / "checkpoints" / ".none.pt.12345.0123abcd.tmp",
        tmp_path / ".results.json.999.deadbeef.tmp",
    ]
    keep = [tmp_path / "notes.tmp", tmp_path / "checkpoints" / ".hidden"]
    for path in stale + keep:
        path.write_bytes(b"half a file")
    run_study(STUDY, out_dir=tmp_path, plot=False)
    assert [p.exists() for p in stale] == [False, False]
    assert all(p.exists() for p in keep)  # only what an atomic write names is removed


def _final(folder: Path) -> dict:
    state = torch.load(folder / "checkpoints" / "none.pt", weights_only=True)
    results = json.loads((folder / "results.json").read_text())
    return {"state": state, "eval": results["runs"][0]["eval"]}


def test_kill_9_then_resume_equals_an_uninterrupted_run_bit_for_bit(tmp_path: Path, capsys) -> None:
    steps = ["--steps", "300", "--checkpoint-every", "10", "--seed", "3"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert _cli([*ARGV, *steps, "--out", str(whole)], capsys)[0] == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "posenc", *ARGV, *steps, "--out", str(cut)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    checkpoint = cut / "checkpoints" / "none.pt"
    deadline = time.monotonic() + 120
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    if proc.returncode != -signal.SIGKILL:
        pytest.fail(f"the run ended before it could be killed: {proc.returncode}")
    assert checkpoint.exists() and not (cut / "results.json").exists()
    code, err = _cli([*ARGV, *steps, "--out", str(cut), "--resume"], capsys)
    assert code == 0, err
    a, b = _final(whole), _final(cut)
    assert a["eval"] == b["eval"]
    for part in ("model", "optimizer"):
        flat_a, flat_b = _flatten(a["state"][part]), _flatten(b["state"][part])
        assert flat_a.keys() == flat_b.keys()
        for key, value in flat_a.items():
            same = (
                torch.equal(value, flat_b[key]) if torch.is_tensor(value) else value == flat_b[key]
            )
            assert same, (part, key)
    assert a["state"]["step"] == b["state"]["step"] == 300


def _flatten(value, prefix: str = "") -> dict:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}/{k}"))
        return out
    if isinstance(value, list):
        out = {}
        for i, v in enumerate(value):
            out.update(_flatten(v, f"{prefix}/{i}"))
        return out
    return {prefix: value}


def _reseal(path: Path, change) -> None:
    """Load ``path``, ``change`` the state, write it back with a valid seal."""
    import hashlib
    import io

    from posenc.experiments.checkpoint import TRAILER

    state = torch.load(path, weights_only=True)
    change(state)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    body = buffer.getvalue()
    path.write_bytes(body + TRAILER + hashlib.sha256(body).hexdigest().encode() + b"\n")


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x10
    path.write_bytes(bytes(data))


def _shape(state: dict) -> None:
    name = next(iter(state["model"]))
    state["model"][name] = torch.zeros(3, 3, 3)


DAMAGE = {
    "flipped-byte": (_flip, "is truncated or corrupt"),
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:-500]), "is truncated or corrupt"),
    "next-step-huge": (
        lambda p: _reseal(p, lambda s: s["data"].update(next_step=10**9)),
        r"field data\['next_step'\] must be an integer in \[1, 3\]",
    ),
    "loss-empty": (lambda p: _reseal(p, lambda s: s.update(loss=[])), "field loss must be"),
    "wrong-shape": (lambda p: _reseal(p, _shape), r"must be a torch.float32 tensor of shape"),
    "junk-optimizer": (
        lambda p: _reseal(p, lambda s: s["optimizer"].update(state={0: "x"})),
        r"field optimizer\['state'\]\[0\] must be the state of a parameter",
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_checkpoint_is_one_line_exit_2_before_training(
    tmp_path: Path, capsys, damage: str
) -> None:
    argv = [*ARGV, "--steps", "3", "--out", str(tmp_path)]
    assert _cli(argv, capsys)[0] == 0
    path = tmp_path / "checkpoints" / "none.pt"
    hurt, pattern = DAMAGE[damage]
    hurt(path)
    damaged = path.read_bytes()
    code, err = _cli([*argv, "--resume"], capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("posenc: error: checkpoint ")
    assert re.search(pattern, err), err
    assert "Traceback" not in err and "weights_only" not in err
    assert path.read_bytes() == damaged  # refused before anything trained or was written
