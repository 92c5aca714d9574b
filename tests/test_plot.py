"""Every plot gives a non-empty figure of the size asked for, in PNG and SVG."""

from __future__ import annotations

import io
import sys

import pytest
from PIL import Image, ImageStat

from posenc import PosEncError, plot

CASES = [
    ("table-additive", lambda **kw: plot.plot_table("sinusoidal", 32, **kw)),
    ("table-rotary", lambda **kw: plot.plot_table("rope", 32, **kw)),
    ("table-bias", lambda **kw: plot.plot_table({"name": "alibi", "num_heads": 2}, 16, **kw)),
    ("similarity-additive", lambda **kw: plot.plot_similarity("learned", 32, **kw)),
    ("similarity-rotary", lambda **kw: plot.plot_similarity("xpos", 32, **kw)),
    ("similarity-none", lambda **kw: plot.plot_similarity("none", 8, **kw)),
    ("decay", lambda **kw: plot.plot_decay(["sinusoidal", "index", "rope", "t5"], 24, **kw)),
    ("decay-one", lambda **kw: plot.plot_decay("alibi", 16, **kw)),
    ("bias", lambda **kw: plot.plot_bias({"name": "t5", "num_heads": 3}, 12, **kw)),
    (
        "bias-query-dependent",
        lambda **kw: plot.plot_bias({"name": "shaw", "num_heads": 2}, 8, **kw),
    ),
    ("clock", lambda **kw: plot.plot_clock_hands("rope", 6, frequencies=[0, 31], **kw)),
]


@pytest.mark.parametrize(("case", "draw"), CASES, ids=[c for c, _ in CASES])
def test_png_has_the_requested_size_and_content(case, draw):
    fig = draw(figsize=(4.0, 3.0), dpi=50)
    data = plot.figure_bytes(fig)
    with Image.open(io.BytesIO(data)) as im:
        assert im.format == "PNG" and im.size == (200, 150)
        # not a blank canvas: the pixels vary
        assert max(hi - lo for lo, hi in ImageStat.Stat(im.convert("L")).extrema) > 100


def test_svg_and_save_figure(tmp_path):
    fig = plot.plot_table("index", 8, figsize=(3, 2), dpi=40)
    svg = plot.save_figure(fig, tmp_path / "t.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg and 'width="216pt"' in svg
    png = plot.save_figure(fig, tmp_path / "t.PNG")
    with Image.open(png) as im:
        assert im.size == (120, 80)


def test_bias_shows_at_most_max_heads():
    fig = plot.plot_bias({"name": "alibi", "num_heads": 8}, 8, max_heads=3)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 4  # 3 heads and the colorbar
    assert "first 3 of 8 heads" in fig.texts[0].get_text()


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: plot.plot_similarity("alibi"), "similarity needs an additive or rotary"),
        (lambda: plot.plot_bias("rope"), "must be a bias encoding"),
        (lambda: plot.plot_clock_hands("sinusoidal"), "must be rotary"),
        (lambda: plot.plot_clock_hands("rope", frequencies=[32]), "frequencies must be <= 31"),
        (lambda: plot.plot_clock_hands("rope", frequencies=[]), "non-empty list"),
        (lambda: plot.plot_table("nosuch"), "name must be one of"),
        (lambda: plot.plot_table("sinusoidal", (4, 4)), "non-empty range"),
        (lambda: plot.plot_table("sinusoidal", figsize=(0, 3)), "figsize must be two positive"),
        (lambda: plot.plot_table("sinusoidal", dpi=1), "dpi must be >= 10"),
        (lambda: plot.plot_decay([]), "at least one encoding"),
        (lambda: plot.plot_bias("t5", max_heads=0), "max_heads must be >= 1"),
        (lambda: plot.figure_bytes(plot.plot_table("none", 4), "jpg"), "format must be one of"),
    ],
)
def test_bad_input_raises(call, match):
    with pytest.raises(PosEncError, match=match):
        call()


def test_save_figure_rejects_other_suffixes(tmp_path):
    with pytest.raises(PosEncError, match="path suffix must be one of 'png', 'svg', got 'pdf'"):
        plot.save_figure(plot.plot_table("none", 4), tmp_path / "x.pdf")


def test_missing_matplotlib_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails as if absent
    with pytest.raises(ImportError, match=r"pip install 'posenc\[plot\]'"):
        plot.plot_table("sinusoidal", 4)


@pytest.mark.parametrize(
    "where",
    ["/proc/x.png", "/sys/x.svg", "folder.png"],
    ids=["proc", "sys", "a-folder"],
)
def test_save_figure_names_path_when_writing_fails(tmp_path, where):
    """/proc/x.png was a FileNotFoundError with a traceback; every OSError now names path."""
    if where == "folder.png":
        (tmp_path / where).mkdir()
        where = str(tmp_path / where)
    fig = plot.plot_table("none", 4, figsize=(2.0, 2.0), dpi=10)
    with pytest.raises(PosEncError, match=rf"path '{where}' cannot be written: "):
        plot.save_figure(fig, where)
    with pytest.raises(PosEncError, match="path must not hold a NUL character"):
        plot.save_figure(fig, str(tmp_path / "a\0b.png"))


def test_figsize_and_dpi_take_numpy_numbers():
    np = pytest.importorskip("numpy")
    a = plot.figure_bytes(
        plot.plot_table(
            "sinusoidal", np.int64(8), figsize=(np.int64(2), np.float32(3.0)), dpi=np.int64(20)
        )
    )
    b = plot.figure_bytes(plot.plot_table("sinusoidal", 8, figsize=(2, 3.0), dpi=20))
    assert Image.open(io.BytesIO(a)).size == Image.open(io.BytesIO(b)).size == (40, 60)
    with pytest.raises(PosEncError, match="figsize must be two positive numbers"):
        plot.plot_table("sinusoidal", 8, figsize=(np.bool_(True), 2.0))
