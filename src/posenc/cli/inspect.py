"""``posenc inspect``: the measured properties of one encoding, as a table in the terminal.

posenc inspect rope
posenc inspect sinusoidal --param dim=128 --length 1024
posenc inspect alibi --json
posenc inspect --hf-config path/to/config.json
posenc inspect --gguf path/to/model.gguf
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from posenc._errors import PosEncError
from posenc.cli._analysis import Params, check_analysis_size, count_option, encoding_config
from posenc.cli._app import app, fail
from posenc.cli._checks import check_regular_file, text

__all__ = ["inspect", "property_rows"]


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _yes(flag: bool | None, yes: str, no: str) -> str:
    return "n/a" if flag is None else (yes if flag else no)


def property_rows(props: Any) -> list[tuple[str, str, str]]:
    """``(property, verdict, detail)`` rows of a :class:`posenc.analysis.Properties`."""
    unit = props.boundedness.unit
    return [
        _boundedness_row(props.boundedness),
        _uniqueness_row(props.uniqueness, unit),
        *_shift_rows(props.shift),
        _decay_row(props.decay),
    ]


def _boundedness_row(b: Any) -> tuple[str, str, str]:
    swamp = (
        f"; exceeds {b.swamp_ratio:g}x at {b.unit} {b.first_swamping:g}"
        if b.first_swamping is not None
        else ""
    )
    return (
        "boundedness",
        _yes(b.bounded, "bounded", "grows"),
        f"{b.measure}: max {_g(b.max_norm)} = {_g(b.max_ratio)} x reference {b.reference}{swamp}",
    )


def _uniqueness_row(u: Any, unit: str) -> tuple[str, str, str]:
    first = (
        f"; closest: {', '.join(f'({c.a:g}, {c.b:g})' for c in u.collisions[:3])}"
        if u.collisions
        else ""
    )
    return (
        "uniqueness",
        "unique" if u.unique else f"{u.num_collisions} collisions",
        f"min distance {_g(u.min_distance)} ({_g(u.min_distance / u.scale if u.scale else 0.0)} "
        f"of the rms norm) between {unit}s {u.closest_pair[0]:g} and {u.closest_pair[1]:g} "
        f"over {u.num_positions} {unit}s{first}",
    )


def _shift_rows(s: Any) -> list[tuple[str, str, str]]:
    rows = []
    if s.linear_map_residuals is not None:
        rows.append(
            (
                "shift: PE(p+k) = M_k PE(p)",
                _yes(s.linear_map_holds, "holds", "fails"),
                f"max relative residual {_g(max(s.linear_map_residuals))} over k = "
                f"{', '.join(map(str, s.offsets))}"
                + ("" if s.linear_map_determined else " (too few positions: any table fits)"),
            )
        )
    rows.append(
        (
            "shift: depends only on k",
            _yes(s.dot_depends_only_on_offset, "yes", "no"),
            f"{s.measure}: max relative spread over p {_g(max(s.dot_spreads))}",
        )
    )
    return rows


def _decay_row(d: Any) -> tuple[str, str, str]:
    picks = [k for k in (1, 4, 16, 64, 256, 1024) if k < len(d.distances)] + [d.distances[-1]]
    curve = d.normalized if d.normalized is not None else d.similarity
    values = ", ".join(f"k={k}: {curve[k]:.3g}" for k in dict.fromkeys(picks))
    what = "normalized" if d.normalized is not None else "mean over heads"
    bound = ""
    if d.bound_normalized is not None:
        bound = "; RoFormer bound " + ", ".join(
            f"{d.bound_normalized[k]:.3g}" for k in dict.fromkeys(picks)
        )
    return ("decay", what, f"{d.measure}: {values}{bound}")


#: Lists longer than this print as a summary (count, range, first values); --json has them.
_SHOWN_VALUES = 8


def short(value: Any) -> Any:
    """``value`` with every list (or tuple) of more than :data:`_SHOWN_VALUES` numbers
    replaced by its summary, at any depth: ``48 values in [1, 1.2]: 1, 1.02, 1.03, ...``."""
    if isinstance(value, dict):
        return {k: short(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        if numbers and len(value) > _SHOWN_VALUES:
            first = ", ".join(f"{v:.4g}" for v in value[:4])
            return f"{len(value)} values in [{min(value):.4g}, {max(value):.4g}]: {first}, ..."
        return [short(v) for v in value]
    return value


def _scaling_lines(enc: dict[str, Any]) -> list[str]:
    """The scaling as its repr, except that a factor list longer than
    :data:`_SHOWN_VALUES` (LongRoPE's 48 + 48) gets a line of its own, summarised."""
    params = enc.get("scaling_parameters")
    if params is None:
        return [f"  scaling: {enc['scaling'] or 'none'}"]
    long = {k: v for k, v in short(params).items() if isinstance(v, str) and k != "type"}
    inline = ", ".join(f"{k}={v!r}" for k, v in params.items() if k not in long)
    lines = [f"  scaling: {enc['scaling'].split('(', 1)[0]}({inline})"]
    return lines + [f"    {k}: {v}" for k, v in long.items()]


def _print_hf(summary: dict[str, Any]) -> None:
    """The ``--hf-config`` summary as plain lines."""
    typer.echo(f"model_type: {summary['model_type']}")
    for layer_type, enc in summary["layers"].items():
        typer.echo(f"layer type {layer_type}:")
        typer.echo(f"  type: {enc['type']}, layout: {enc['layout']}, base: {enc['base']:g}")
        typer.echo(
            f"  rotary_dim: {enc['rotary_dim']} of head_dim {enc['head_dim']} ({enc['partial']})"
        )
        if enc["sections"] is not None:
            typer.echo(f"  sections: {enc['sections']}")
        typer.echo(
            f"  inverse frequencies: first {enc['inv_freq_first']:.6g}, last "
            f"{enc['inv_freq_last']:.6g}; wavelengths {enc['wavelength_min']:.4g} .. "
            f"{enc['wavelength_max']:.4g} positions"
        )
        typer.echo("\n".join(_scaling_lines(enc)))
        typer.echo(f"  attention scale: {enc['attention_scale']:.6g}")
    tf = summary["transformers"]
    if tf["status"] != "compared":
        typer.echo(f"transformers: {tf['status']}")
        return
    where = ", ".join(f"{p:g}" for p in tf["positions"])
    for layer_type, err in tf["max_error"].items():
        typer.echo(
            f"transformers: max |cos/sin error| vs the family's rotary module at positions "
            f"{where} ({layer_type}): {err:.3g}"
        )
    typer.echo(
        "  (transformers forms position * inv_freq in float32, off by up to position * 3.1e-7 "
        "rad; posenc's angles are exact to float32 rounding)"
    )


def _inspect_hf(path: str, as_json: bool, param: list[str] | None) -> None:
    from posenc.cli._hf_inspect import hf_summary

    try:
        if param:
            raise PosEncError("--param does not apply to --hf-config (the config sets it all)")
        summary = hf_summary(path)
    except PosEncError as e:  # the library's refusals name the key; the line the option
        message = str(e)
        fail(message if message.startswith("--") else f"--hf-config {path!r}: {message}")
        return
    if as_json:
        typer.echo(json.dumps(summary, indent=1))
    else:
        _print_hf(summary)


def _print_gguf(summary: dict[str, Any]) -> None:
    """The ``--gguf`` summary as plain lines."""
    from posenc.cli._gguf_inspect import layer_ranges

    typer.echo(f"file: {summary['file']}")
    typer.echo(
        f"architecture: {summary['architecture']}, context length {summary['context_length']}, "
        f"{summary['block_count']} layers"
    )
    for key, value in summary["metadata"].items():
        typer.echo(f"  {key} = {short(value)}")
    for layer_type, enc in summary["layers"].items():
        where = f"{len(enc['layers'])} layers: {layer_ranges(enc['layers'])}"
        if not enc["rotates"]:
            typer.echo(f"layers without RoPE ({where})")
            continue
        typer.echo(f"layer type {layer_type} ({where}):")
        typer.echo(
            f"  type: {enc['type']}, llama.cpp rope type {enc['llama_cpp_rope_type']}, "
            f"base: {enc['base']:g}"
        )
        typer.echo(
            f"  layout: {enc['layout']} for the GGUF tensors as stored, "
            f"{enc['layout_transformers']} for the weights as transformers loads them"
        )
        typer.echo(
            f"  rotary_dim: {enc['rotary_dim']} of head_dim {enc['head_dim']} ({enc['partial']})"
        )
        if enc["sections"] is not None:
            typer.echo(f"  sections: {enc['sections']}")
        typer.echo(
            f"  inverse frequencies: first {enc['inv_freq_first']:.6g}, last "
            f"{enc['inv_freq_last']:.6g}; wavelengths {enc['wavelength_min']:.4g} .. "
            f"{enc['wavelength_max']:.4g} positions"
        )
        typer.echo("\n".join(_scaling_lines(enc)))
        typer.echo(f"  attention scale: {enc['attention_scale']:.6g}")
        config = dict(enc["config"])
        if isinstance(config.get("scaling"), dict):  # printed above, whole in --json
            config["scaling"] = f"{config['scaling'].get('type')} (as above)"
        typer.echo(f"  config: {json.dumps(short(config))}")


def _inspect_gguf(path: str, as_json: bool, param: list[str] | None) -> None:
    from posenc.cli._gguf_inspect import gguf_summary

    try:
        check_regular_file("--gguf", path)  # a FIFO or /dev/zero is not handed to the reader
        if param:
            raise PosEncError("--param does not apply to --gguf (the file sets it all)")
        summary = gguf_summary(path)
    except PosEncError as e:
        fail(str(e))
        return
    if as_json:
        typer.echo(json.dumps(summary, indent=1))
    else:
        _print_gguf(summary)


# The options of `posenc inspect`, each checked when it is parsed (cli/_checks).
EncodingArg = Annotated[
    str | None,
    typer.Argument(metavar="ENCODING", help="Registry name, e.g. rope.", callback=text("ENCODING")),
]
Length = Annotated[
    int, count_option("--length", "Positions 0..length-1 measured (bias: distances).", min=2)
]
MaxDistance = Annotated[
    int, count_option("--max-distance", "Largest distance of the decay.", min=1)
]
Json = Annotated[bool, typer.Option("--json", help="Print every number as JSON.")]
HfConfig = Annotated[
    str | None,
    typer.Option(
        "--hf-config",
        help="A transformers config.json (read as JSON, nothing run or downloaded): the "
        "encoding posenc builds for it, and its error against the family's rotary.",
        callback=text("--hf-config"),
    ),
]

Gguf = Annotated[
    str | None,
    typer.Option(
        "--gguf",
        help="A GGUF file (only its header is read): the RoPE llama.cpp rotates each layer "
        "type with, as posenc reads it.",
        callback=text("--gguf"),
    ),
]


@app.command("inspect")
def inspect(
    encoding: EncodingArg = None,
    param: Params = None,
    length: Length = 512,
    max_distance: MaxDistance = 128,
    as_json: Json = False,
    hf_config: HfConfig = None,
    gguf: Gguf = None,
) -> None:
    """Measure an encoding: boundedness, uniqueness, shift structure and decay; or, with
    --hf-config, the encoding posenc reads from a transformers config; or, with --gguf, the
    RoPE of a GGUF file."""
    if gguf is not None:
        if encoding is not None or hf_config is not None:
            fail("give one of ENCODING, --hf-config or --gguf, not several")
            return
        _inspect_gguf(gguf, as_json, param)
        return
    if hf_config is not None:
        if encoding is not None:
            fail("give ENCODING or --hf-config, not both")
            return
        _inspect_hf(hf_config, as_json, param)
        return
    if encoding is None:
        fail("missing ENCODING (a registry name, e.g. rope), --hf-config PATH or --gguf FILE")
        return
    try:
        props = _measure(encoding, param, length, max_distance)
    except PosEncError as e:
        fail(str(e))
        return
    if as_json:
        typer.echo(json.dumps(props.to_dict(), indent=1))
    else:
        _print_properties(props)


def _measure(encoding: str, param: list[str] | None, length: int, max_distance: int) -> Any:
    """The :class:`posenc.analysis.Properties` of ``encoding`` built with ``--param``."""
    from posenc.analysis import properties

    spec = encoding_config(encoding, param)
    check_analysis_size("inspect", spec, length, max_distance=max_distance)
    return properties(spec, length, shift_positions=min(length, 256), max_distance=max_distance)


def _print_properties(props: Any) -> None:
    """The rows of :func:`property_rows` as a table under the encoding's config."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(highlight=False)
    config = ", ".join(f"{k}={v}" for k, v in props.config.items() if k != "name")
    grid = Table(
        title=Text(f"{props.encoding} ({props.kind}) {config}"),
        box=box.SIMPLE_HEAD,
        title_justify="left",
        show_lines=False,
    )
    grid.add_column("property", style="bold", no_wrap=True)
    grid.add_column("result", no_wrap=True)
    grid.add_column("detail")
    for name, verdict, detail in property_rows(props):
        grid.add_row(name, verdict, Text(detail))  # Text: no markup, "E[q.k]" stays
    console.print(grid)
