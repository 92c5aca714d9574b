"""The report page: one self-contained HTML file, figures embedded as base64 PNG data URIs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from posenc._pages import escape as _e
from posenc._pages import number as _num
from posenc._pages import page
from posenc.analysis.summary import SUMMARY_COLUMNS
from posenc.report.study_html import embedded, headline_section, lengthgen_section

__all__ = ["render_html"]


def _cell(key: str, value: Any) -> str:
    if key in ("bounded", "unique", "offset_only"):
        return f'<td class="{"yes" if value else "no"}">{"yes" if value else "no"}</td>'
    if key in ("encoding", "kind"):
        return f'<td class="text">{_e(value)}</td>'
    if key == "first_swamping":
        return f"<td>{'never' if value is None else _num(value)}</td>"
    if key == "shift_residual":
        return f"<td>{'n/a' if value is None else _num(value, 2)}</td>"
    return f"<td>{_num(value)}</td>"


def _property_table(data: dict[str, Any]) -> str:
    head = "".join(
        f'<th class="{"text" if k in ("encoding", "kind") else ""}" title="{_e(desc)}">{_e(h)}</th>'
        for k, h, desc in SUMMARY_COLUMNS
    )
    rows = []
    for entry in data["encodings"]:
        name = _e(entry["name"])
        if entry["error"] is not None:
            rows.append(
                f'<tr class="encoding-row error" data-encoding="{name}"><td class="text">{name}</td>'
                f'<td colspan="{len(SUMMARY_COLUMNS) - 1}" class="text">could not be measured '
                f"with the analysis defaults: {_e(entry['error'])}</td></tr>"
            )
            continue
        cells = "".join(_cell(k, entry["summary"][k]) for k, _, _ in SUMMARY_COLUMNS)
        rows.append(f'<tr class="encoding-row" data-encoding="{name}">{cells}</tr>')
    legend = "".join(f"<dt>{_e(h)}</dt><dd>{_e(desc)}</dd>" for _, h, desc in SUMMARY_COLUMNS)
    s = data["settings"]
    return f"""
<section id="properties">
<h2>Properties of every encoding</h2>
<p class="lead">Each row measures one registered encoding, built with the analysis defaults
(<code>{_e(json.dumps(s["analysis_defaults"]))}</code>), over positions 0..{s["positions"] - 1}
(bias encodings: distances between query and key). Additive encodings are compared with an
N(0, 1) token embedding of the same size; rotary encodings with a pure rotation; biases with the
unit spread of scaled logits. CoPE and forgetting attention depend on the tokens, so they are
measured in one fixed context: CoPE with every gate open (each token counts one position) and
its table as built, zero, so that it adds nothing until trained; forgetting attention with
every forget gate 1/2 (ALiBi's form, slope ln 2). Every number, with the per-position curves,
is in <code>report.json</code>.</p>
<div class="scroll"><table id="property-table"><thead><tr>{head}</tr></thead>
<tbody>{"".join(rows)}</tbody></table></div>
<dl class="legend">{legend}</dl>
</section>"""


def _encoding_cards(data: dict[str, Any], out: Path) -> str:
    by_file = {r["file"]: r for r in data["figures"]}
    cards = []
    for entry in data["encodings"]:
        if entry["error"] is not None or not entry["figures"]:
            continue
        config = ", ".join(f"{k}={v}" for k, v in (entry["config"] or {}).items() if k != "name")
        figs = "".join(embedded(out, by_file[f]) for f in entry["figures"])
        cards.append(
            f'<article class="card" id="enc-{_e(entry["name"])}"><h3>{_e(entry["name"])}'
            f'<span class="kind">{_e(entry["kind"])}</span></h3>'
            f'<p class="config">{_e(config) or "(no arguments)"}</p><div class="figs">{figs}</div></article>'
        )
    return f"""
<section id="encodings">
<h2>What each encoding looks like</h2>
<p class="lead">Additive encodings: the table PE(p) (position down, channel across) and the
cosine similarity of every pair of positions. Rotary encodings: cos and sin of every angle
p&nbsp;&middot;&nbsp;&theta;<sub>i</sub>, and the similarity of the rotations (the expected q&middot;k of a
random query and key). Bias encodings: the bias each head adds to the attention logits
(query down, key across).</p>
<div class="cards">{"".join(cards)}</div>
</section>"""


def _decay_section(data: dict[str, Any], out: Path) -> str:
    figs = "".join(embedded(out, r, "wide") for r in data["figures"] if r["section"] == "decay")
    return f"""
<section id="decay">
<h2>Decay with distance</h2>
<p class="lead">How much a query at position p&nbsp;+&nbsp;k still resembles a key at p. Sinusoidal
tables and RoPE give the same curve (both are sums of cos(k&theta;<sub>i</sub>)); the dashed lines
are the shape of RoFormer's long-term decay bound. Learned tables start random (no decay), the
naive index grows. Bias encodings act on the logits directly: ALiBi falls linearly, T5 is
learned per bucket.</p>
{figs}
</section>"""


def _demo_section(data: dict[str, Any]) -> str:
    d = data["demonstrations"]
    a, b, sw = d["mean_pooling"], d["index_pooling"], d["index_swamping"]
    s1, s2 = (_e(x) for x in d["sentences"])

    def verdict(apart: bool) -> str:
        return "tells them apart" if apart else "cannot tell them apart"

    rows = []
    for row in d["attention"]:
        words = "".join(f"<td>{_num(row['word_distances'][w])}</td>" for w in d["vocabulary"])
        same = row["permutation_equivariant"]
        rows.append(
            f'<tr><td class="text">{_e(row["label"])}</td>{words}<td>{_num(row["scale"])}</td>'
            f'<td class="{"no" if same else "yes"}">{"same (permuted)" if same else "differ"}</td></tr>'
        )
    word_heads = "".join(f"<th>{_e(w)}</th>" for w in d["vocabulary"])
    return f"""
<section id="demonstrations">
<h2>Why attention needs positions: the classic demonstrations</h2>
<p class="lead">The sentences <b>&ldquo;{s1}&rdquo;</b> and <b>&ldquo;{s2}&rdquo;</b> hold the same
words. Random N(0, 1) token embeddings of size {d["dim"]} (seed {d["seed"]}); attention has
{d["num_heads"]} heads with random projections and runs through <code>posenc.attention</code>.</p>
<div class="demo" id="demo-a"><h3>(a) Mean-pooled embeddings <span>bag of words</span></h3>
<p>Distance between the two sentences' mean embeddings: <b>{_num(a["pooled_distance"])}</b>
(token norm {_num(a["scale"])}). The mean <span class="verdict">{verdict(a["tells_apart"])}</span>:
a sum does not see order.</p></div>
<div class="demo" id="demo-b"><h3>(b) Adding the naive index p <span>the first idea</span></h3>
<p>Distance after adding PE(p) = p to every channel: <b>{_num(b["pooled_distance"])}</b>: the pooled
model still <span class="verdict">{verdict(b["tells_apart"])}</span> (both sentences get the same
positions). Worse, at position {sw["position"]} the encoding's norm is {_num(sw["position_norm"])},
<b>{_num(sw["ratio"])}&times;</b> a token's: the cosine between &ldquo;{_e(sw["words"][0])}&rdquo; and
&ldquo;{_e(sw["words"][1])}&rdquo; goes from {_num(sw["token_cosine"])} to
<b>{_num(sw["encoded_cosine"], 5)}</b> once the position is added. The position swamps the token.</p></div>
<div class="demo" id="demo-cd"><h3>(c) and (d) One self-attention layer <span>output of each word,
first sentence against second</span></h3>
<p>Without positions, each word's output is the same wherever it stands: the outputs only permute
with the inputs (c). Sinusoidal positions added to the embeddings, RoPE in attention, ALiBi or
just the causal mask make them differ (d). A symmetric bias in bidirectional attention cannot
tell a sentence from its reverse: every distance |i&nbsp;&minus;&nbsp;j| is kept.</p>
<div class="scroll"><table id="attention-demo"><thead><tr><th class="text">setting</th>{word_heads}
<th>output rms</th><th>each word's output</th></tr></thead><tbody>{"".join(rows)}</tbody></table></div>
<p class="lead">Cells: &#8214;out<sub>1</sub>[word] &minus; out<sub>2</sub>[word]&#8214;.</p></div>
</section>"""


def render_html(data: dict[str, Any], out: Path) -> str:
    """The report page for ``data`` (as written to ``report.json``); figures are read from
    ``out`` and embedded."""
    s = data["settings"]
    mode = "quick run" if s["quick"] else "default run"
    n = len(data["encodings"])
    body = f"""<header><h1>posenc report</h1>
<p class="meta">posenc {_e(data["posenc_version"])} &middot; {_e(data["created"])} &middot; {mode}
&middot; {n} encodings &middot; every number in <a href="report.json" style="color:#fff">report.json</a></p>
<nav><a href="#answer">The answer</a><a href="#properties">Properties</a><a href="#encodings">Pictures</a><a href="#decay">Decay</a>
<a href="#demonstrations">Demonstrations</a><a href="#lengthgen">Length generalization</a></nav>
</header>
<main>
{headline_section(data, out)}
{_property_table(data)}
{_encoding_cards(data, out)}
{_decay_section(data, out)}
{_demo_section(data)}
{lengthgen_section(data, out)}
<footer>Made by <code>posenc report{" --quick" if s["quick"] else ""}</code>. Figures are also in
this folder as PNG files.</footer>
</main>"""
    return page("posenc report", body)
