"""``posenc lengthgen``: a tiny run, one-line errors with exit code 2, and the torchrun path."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from posenc.experiments import run_study

from .schema import check_results
from .tiny import CLI_TINY as TINY
from .tiny import check_one_line_error, run_cli, tiny_study


def test_a_tiny_run_writes_results_and_figure(tmp_path: Path, capsys) -> None:
    loud = [a for a in TINY if a != "--quiet"]  # progress bars on stderr, summary on stdout
    code, out, err = run_cli(
        [
            "lengthgen",
            "--task",
            "copy",
            "--encodings",
            "none,rope,learned",
            "--train-len",
            "9",
            "--eval-lens",
            "L,2L",
            "--out",
            str(tmp_path),
            "--seed",
            "3",
            *loud,
        ],
        capsys,
    )
    assert code == 0
    assert "posenc: error" not in err and "3/3" in err  # every bar reached its last step
    assert "copy: accuracy at each eval length" in out  # the summary table
    assert all(f"│ {name} " in out for name in ("none", "rope", "learned"))
    assert f"wrote {tmp_path / 'results.json'} and {tmp_path / 'lengthgen.png'}" in out
    results = json.loads((tmp_path / "results.json").read_text())
    check_results(
        results, task="copy", train_len=9, eval_lens=[9, 18], encodings=["none", "rope", "learned"]
    )
    assert results["settings"]["train"]["seed"] == 3
    assert (tmp_path / "lengthgen.png").stat().st_size > 1000


def test_seeds_and_jobs_summarise_mean_and_spread(tmp_path: Path, capsys) -> None:
    loud = [a for a in TINY if a != "--quiet"]
    argv = ["lengthgen", "--task", "copy", "--encodings", "alibi,learned", "--train-len", "9"]
    argv += ["--eval-lens", "L,2L", "--out", str(tmp_path), "--seeds", "0,1,2", "--jobs", "2"]
    code, out, err = run_cli([*argv, *loud], capsys)
    assert code == 0, err
    assert "alibi s2" in err  # a progress bar per (encoding, seed)
    flat = " ".join(out.split())  # rich wraps the title and cells to the terminal's width
    assert "mean (min-max) over seeds 0, 1, 2" in flat
    results = json.loads((tmp_path / "results.json").read_text())
    labels = ["alibi"] * 3 + ["learned"] * 3
    check_results(results, task="copy", train_len=9, eval_lens=[9, 18], encodings=labels)
    assert [r["seed"] for r in results["runs"]] == [0, 1, 2, 0, 1, 2]
    assert results["environment"]["jobs"] == 2
    cell = results["summary"]["alibi"]["9"]["accuracy"]
    assert f"{cell['mean']:.2f} ({cell['min']:.2f}-{cell['max']:.2f})" in flat


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (["--task", "sort"], "task must be one of 'lm', 'copy'.*got 'sort'"),
        (["--encodings", "rope,fancy"], "encoding name must be one of .*got 'fancy'"),
        (["--eval-lens", "8,0"], r"--eval-lens entry must be >= 1, got 0"),
        (["--eval-lens", "8,x"], r"--eval-lens entries must be integers or kL, got 'x'"),
        (["--eval-lens", "-8"], r"--eval-lens entries must be integers or kL, got '-8'"),
        (["--steps", "0"], "steps must be >= 1, got 0"),
        (["--steps", "many"], "Invalid value for '--steps'"),
        (["--device", "gpu"], "device must be one of 'cpu', 'cuda', got 'gpu'"),
        (["--extend", "pi", "--encodings", "alibi"], "extend needs 'rope' among the encodings"),
        (["--threads", "0"], "--threads must be >= 1, got 0"),
        (["--jobs", "0"], "--jobs must be >= 1, got 0"),
        (["--seeds", "0,0"], "--seeds must be distinct, got '0,0'"),
        (
            ["--seeds", "0,x"],
            r"--seeds entries must be integers \(digits, an optional -\), got 'x'",
        ),
        (["--seeds", ","], "--seeds must not hold an empty entry, got ','"),
        (["--seeds", "1", "--seed", "2"], "give --seed or --seeds, not both"),
        (["--preset", "huge"], "--preset must be one of 'default', 'quick', got 'huge'"),
        (["--optimizer", "sgd"], "--optimizer must be one of 'adamw', 'muon', got 'sgd'"),
        (
            ["--dim", "4096", "--layers", "512", "--heads", "8"],
            r"this study needs about [\d.]+ TB of memory per process \(dim 4096, 512 layers",
        ),
        (["--eval-lens", "1000000"], r"this study needs about [\d.]+ TB of memory per process"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    tmp_path: Path, capsys, args: list[str], pattern: str
) -> None:
    base = [
        "lengthgen",
        "--task",
        "lm",
        "--encodings",
        "rope",
        "--train-len",
        "8",
        "--eval-lens",
        "8,16",
        "--out",
        str(tmp_path / "out"),
        *TINY,
    ]
    code, _, err = run_cli(base + args, capsys)
    check_one_line_error(code, err, pattern)
    assert not (tmp_path / "out").exists()  # nothing trained, not even the folder made


def test_unwritable_out_dir(tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("")
    code, _, err = run_cli(
        [
            "lengthgen",
            "--encodings",
            "rope",
            "--train-len",
            "8",
            "--eval-lens",
            "8",
            "--out",
            str(tmp_path / "file" / "out"),
            *TINY,
        ],
        capsys,
    )
    check_one_line_error(
        code, err, r"--out '.*file/out' cannot be created \(Not a directory: '.*file'\)"
    )


def test_resume_from_another_config_or_a_corrupt_checkpoint(tmp_path: Path, capsys) -> None:
    base = [
        "lengthgen",
        "--encodings",
        "none",
        "--train-len",
        "8",
        "--eval-lens",
        "8",
        "--out",
        str(tmp_path),
        *TINY,
    ]
    assert run_cli(base, capsys)[0] == 0
    code, _, err = run_cli([*base, "--resume", "--seed", "1"], capsys)
    check_one_line_error(
        code,
        err,
        r"checkpoint '.*none\.pt' was written by a different "
        r"configuration \(train: .*\"seed\": 0.* != .*\"seed\": 1",
    )
    path = tmp_path / "checkpoints" / "none.pt"
    path.write_bytes(path.read_bytes()[:-200])
    code, _, err = run_cli([*base, "--resume"], capsys)
    check_one_line_error(code, err, r"checkpoint '.*none\.pt' is truncated or corrupt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun_lengthgen(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--master-addr=127.0.0.1",
            f"--master-port={_free_port()}",
            "-m",
            "posenc",
            "lengthgen",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def _failure(proc: subprocess.CompletedProcess) -> str:
    """Both ends of a failed run's stderr: the ranks' own errors come first, torchrun's
    summary of them last."""
    err = proc.stderr
    return err if len(err) <= 8000 else f"{err[:5000]}\n[...]\n{err[-3000:]}"


def _aborted_after_results(proc: subprocess.CompletedProcess, out: Path) -> bool:
    """A rank aborted (SIGABRT) once the results were written. Rank 0 writes them after
    the study's last collective, so the abort came at the last barrier or in the
    process group's teardown, after everything this test checks was computed. Seen once
    in CI (``terminate called without an active exception`` from rank 1, in one of ~12
    CI runs and none of 40 local ones under load); the cause, in torch's C++ teardown,
    was not pinned down."""
    return "exitcode: -6" in proc.stderr and (out / "results.json").is_file()


def test_two_process_ddp_run_matches_one_process(tmp_path: Path) -> None:
    def args(out: Path) -> list[str]:
        return [
            "--task",
            "copy",
            "--encodings",
            "alibi,rope",
            "--train-len",
            "9",
            "--eval-lens",
            "9,18",
            "--out",
            str(out),
            *TINY,
        ]

    proc = _torchrun_lengthgen(args(tmp_path / "ddp"))
    if proc.returncode != 0 and _aborted_after_results(proc, tmp_path / "ddp"):
        first = _failure(proc)  # once more, into a fresh folder: the race is torch's
        proc = _torchrun_lengthgen(args(tmp_path / "ddp-again"))
        assert proc.returncode == 0, f"aborted twice:\n{first}\n---\n{_failure(proc)}"
        (tmp_path / "ddp").rename(tmp_path / "ddp-aborted")
        (tmp_path / "ddp-again").rename(tmp_path / "ddp")
    assert proc.returncode == 0, _failure(proc)
    ddp = json.loads((tmp_path / "ddp" / "results.json").read_text())
    check_results(ddp, task="copy", train_len=9, eval_lens=[9, 18], encodings=["alibi", "rope"])
    assert ddp["environment"]["world_size"] == 2
    # Same global batches, gradients averaged over the two shards: the same training as
    # one process up to float summation order.
    one = run_study(tiny_study("copy", ["alibi", "rope"], train_len=9, eval_lens=[9, 18]))
    for a, b in zip(ddp["runs"], one["runs"]):
        assert a["train"]["final_loss"] == pytest.approx(b["train"]["final_loss"], rel=1e-5)
        for length in ("9", "18"):
            assert a["eval"][length]["loss"] == pytest.approx(b["eval"][length]["loss"], rel=1e-4)
            assert a["eval"][length]["examples"] == b["eval"][length]["examples"] == 8
