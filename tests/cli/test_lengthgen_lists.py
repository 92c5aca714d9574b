"""The list options of ``posenc lengthgen`` are parsed strictly: an empty entry, ``1_000``,
``+1`` or another script's digits is one line naming the option, exit code 2 (``int()``
alone accepted them, and an empty entry was skipped)."""

from __future__ import annotations

import pytest
from tests.experiments.tiny import check_one_line_error, run_cli

BASE = ["lengthgen", "--task", "copy", "--train-len", "8", "--steps", "1", "--no-plot"]

CASES = {
    "seeds-empty-entry": (["--seeds", "0,,1"], r"--seeds must not hold an empty entry, got '0,,1'"),
    "seeds-trailing-comma": (["--seeds", "0,1,"], r"--seeds must not hold an empty entry"),
    "seeds-underscore": (["--seeds", "1_000"], r"--seeds entries must be integers .* '1_000'"),
    "seeds-plus": (["--seeds", "+1"], r"--seeds entries must be integers .* '\+1'"),
    "seeds-other-digits": (["--seeds", "\u0663"], r"--seeds entries must be integers"),
    "eval-lens-empty-entry": (["--eval-lens", "8,,16"], r"--eval-lens must not hold an empty"),
    "eval-lens-underscore": (["--eval-lens", "8,1_6"], r"--eval-lens entries must be integers"),
    "eval-lens-plus": (["--eval-lens", "+16"], r"--eval-lens entries must be integers or kL"),
    "eval-lens-superscript-L": (["--eval-lens", "\u00b2L"], r"--eval-lens entries must be int"),
    "eval-lens-repeated": (["--eval-lens", "L,8"], r"eval_lens must be distinct, got \[8, 8\]"),
    "encodings-empty-entry": (
        ["--encodings", "rope,,alibi"],
        r"--encodings must not hold an empty entry, got 'rope,,alibi'",
    ),
    "extend-empty-entry": (["--extend", "pi,,ntk"], r"--extend must not hold an empty entry"),
    "extend-none-in-a-list": (["--extend", "pi,none"], r"--extend must be one of .* got 'none'"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_list_entry_is_refused(tmp_path, capsys, case: str) -> None:
    extra, pattern = CASES[case]
    encodings = [] if "--encodings" in extra else ["--encodings", "rope"]
    code, _, err = run_cli([*BASE, "--out", str(tmp_path / "out"), *encodings, *extra], capsys)
    check_one_line_error(code, err, pattern)
    assert not (tmp_path / "out").exists()


def test_good_lists_still_parse() -> None:
    from posenc.cli.lengthgen import _lengths, _seeds

    assert _seeds(" 0, -1 ,2") == " 0, -1 ,2"
    assert _lengths("8, 2L,32,l", 8) == [8, 16, 32, 8]
