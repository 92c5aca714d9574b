"""Training throughput: posenc's study loop against a plain PyTorch loop of the same model.

    python benchmarks/train_throughput.py                 # rope, alibi, sinusoidal, t5; 1 thread
    python benchmarks/train_throughput.py --quick         # a fast run (nothing written)
    python benchmarks/train_throughput.py --repeats 11 --steps 60 --out run.json

What is timed is whole training runs of ``--steps`` optimizer steps, as ``posenc lengthgen``
trains each encoding (the "default" preset: dim 64, 2 layers, 4 heads, MLP 4x, tied head,
batch 32, train length 64, the ``lm`` task, lr 1e-2 with warmup ``steps // 10`` and a cosine
to 0.1x, AdamW betas (0.9, 0.95), weight decay 0.01 on matrices, grad clip 1.0, float32, one
thread per process as each study worker uses; ``--optimizer muon``: Muon on the blocks'
matrices and AdamW on the rest, on both sides, as ``posenc report`` trains):

- ``posenc``: ``posenc.experiments.train.train(model, task, settings)`` on the
  ``TinyTransformer`` of ``posenc.experiments.models.build_model`` (checkpoints off). The
  loop draws each step's batch from the task itself (``task.train_batch``), as in a study;
- ``plain``: a nanoGPT-style model and loop written here with no posenc code: token
  embedding, pre-norm blocks with causal self-attention through
  ``F.scaled_dot_product_attention`` and a GELU MLP, the same tied head; RoPE cos/sin, the
  ALiBi bias, T5's bucket indices and the sinusoidal table computed once at construction
  (what such a model keeps as buffers); AdamW with the same groups, the same schedule
  (written out again) and ``clip_grad_norm_``. It trains on the very batches posenc draws
  (drawn once, before timing, with ``posenc.experiments.tasks``).

First the two models are shown to be one model: the same parameter count, and with posenc's
initial weights copied into the plain one the same loss, logits and gradients on a batch
within float32 tolerance (the script exits 1 otherwise). Then the two loops run interleaved,
the order alternating between repeats, each from the same initial weights; each cell is the
median over ``--repeats`` runs of the wall time of one run (optimizer construction included)
divided by its steps. ``posenc / plain`` above 1 means posenc's loop is slower. The final
training losses of both loops are printed too: the same data and model give nearly the same
curve (not bit-identical: the kernels differ).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ENCODINGS = ("rope", "alibi", "sinusoidal", "t5", "none")
DEFAULT_ENCODINGS = ["rope", "alibi", "sinusoidal", "t5"]
RESULTS = Path(__file__).parent / "results"

# --- the plain model: nanoGPT-style, no posenc code -----------------------------------------


def rope_cos_sin(head_dim: int, max_len: int, base: float = 10000.0):
    """cos/sin ``[max_len, head_dim / 2]`` of ``p * base^(-2i / head_dim)``, float64 rounded once."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq
    return angles.cos().float(), angles.sin().float()


def rotate_half_layout(x, cos, sin):
    """RoPE, half layout (GPT-NeoX / Llama): channel ``i`` pairs with ``i + d / 2``."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def alibi_get_slopes(n: int) -> list[float]:
    """The ALiBi paper's slopes (its reference code's ``get_slopes``)."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + alibi_get_slopes(2 * closest)[0::2][: n - closest]


def t5_bucket(relative_position, num_buckets: int, max_distance: int):
    """T5's ``_relative_position_bucket`` for a decoder (unidirectional), as in transformers."""
    n = -torch.clamp(relative_position, max=0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    large = max_exact + (
        torch.log(n.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    large = torch.clamp(large, max=num_buckets - 1)
    return torch.where(is_small, n, large)


def sinusoidal(max_len: int, dim: int, base: float = 10000.0):
    """The Transformer's table ``[max_len, dim]``: sin in even channels, cos in odd ones."""
    freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.arange(max_len, dtype=torch.float64)[:, None] * freq
    pe = torch.empty(max_len, dim, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = angles.sin(), angles.cos()
    return pe.float()


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x, rope=None, mask=None):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # [B, nh, T, hd]
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if rope is not None:
            q, k = rotate_half_layout(q, *rope), rotate_half_layout(k, *rope)
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # a float mask: the bias with -inf above the diagonal
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, dim: int, n_head: int, mlp_ratio: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, n_head)
        self.norm2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, mlp_ratio * dim)
        self.out = nn.Linear(mlp_ratio * dim, dim)

    def forward(self, x, rope=None, mask=None):
        x = x + self.attn(self.norm1(x), rope, mask)
        return x + self.out(F.gelu(self.fc(self.norm2(x))))


class PlainGPT(nn.Module):
    """Embedding x sqrt(dim), pre-norm blocks, final norm, head tied as ``(h / sqrt(dim)) E^T``."""

    def __init__(
        self,
        vocab_size: int,
        *,
        dim: int,
        n_layer: int,
        n_head: int,
        mlp_ratio: int,
        encoding: str,
        max_len: int,
        tie: bool = True,
        t5_buckets: int = 32,
        t5_max_distance: int = 64,
    ) -> None:
        super().__init__()
        self.dim, self.kind = dim, encoding
        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(Block(dim, n_head, mlp_ratio) for _ in range(n_layer))
        self.norm = nn.LayerNorm(dim)
        self.head = None if tie else nn.Linear(dim, vocab_size, bias=False)
        i = torch.arange(max_len)
        causal = torch.zeros(max_len, max_len).masked_fill(i[None, :] > i[:, None], -math.inf)
        if encoding == "rope":
            cos, sin = rope_cos_sin(dim // n_head, max_len)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)
        elif encoding == "alibi":
            slopes = torch.tensor(alibi_get_slopes(n_head))[:, None, None]  # [h, 1, 1]
            distance = (i[:, None] - i[None, :]).float()  # query minus key
            mask = -(slopes * distance) + causal  # [h, T, T]
            self.register_buffer("mask", mask, persistent=False)
        elif encoding == "t5":
            self.encoding = nn.Embedding(t5_buckets, n_head)  # the learned bias per bucket
            buckets = t5_bucket(i[None, :] - i[:, None], t5_buckets, t5_max_distance)
            self.register_buffer("buckets", buckets, persistent=False)  # [T, T]
            self.register_buffer("causal", causal, persistent=False)
        elif encoding == "sinusoidal":
            self.register_buffer("pe", sinusoidal(max_len, dim), persistent=False)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.embed(idx) * math.sqrt(self.dim)
        rope = mask = None
        if self.kind == "sinusoidal":
            x = x + self.pe[:T]
        elif self.kind == "rope":
            rope = self.cos[:T], self.sin[:T]
        elif self.kind == "alibi":
            mask = self.mask[:, :T, :T]
        elif self.kind == "t5":
            bias = self.encoding.weight[self.buckets[:T, :T]].permute(2, 0, 1)  # [h, T, T]
            mask = bias + self.causal[:T, :T]
        for block in self.blocks:
            x = block(x, rope, mask)
        x = self.norm(x)
        if self.head is None:
            return (x * self.dim**-0.5) @ self.embed.weight.T
        return self.head(x)


def plain_lr(step: int, steps: int, peak: float, warmup: int, min_ratio: float) -> float:
    """Linear warmup, then a cosine to ``peak * min_ratio`` at the last step."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup - 1)
    return peak * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


class PlainTrainer:
    """nanoGPT's loop, one step at a time: AdamW (decay on matrices), lr per step, clip, step."""

    def __init__(self, model: PlainGPT, cfg: dict[str, Any], steps: int) -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        hidden: list[torch.Tensor] = []
        if cfg["optimizer"] == "muon":  # Muon on the blocks' matrices, as in modded-nanoGPT
            hidden = [p for p in model.blocks.parameters() if p.ndim == 2]
        rest = [p for p in params if all(p is not h for h in hidden)]
        groups = [
            {"params": [p for p in rest if p.ndim >= 2], "weight_decay": cfg["weight_decay"]},
            {"params": [p for p in rest if p.ndim < 2], "weight_decay": 0.0},
        ]
        self.optimizers: list[torch.optim.Optimizer] = [
            torch.optim.AdamW(groups, lr=cfg["lr"], betas=(0.9, 0.95), eps=1e-8)
        ]
        if hidden:
            self.optimizers.append(
                torch.optim.Muon(
                    hidden,
                    lr=cfg["lr"],
                    weight_decay=cfg["weight_decay"],
                    adjust_lr_fn="match_rms_adamw",
                )
            )
        self.model, self.cfg, self.steps = model, cfg, steps
        self.losses: list[float] = []
        model.train()

    def step(self, step: int, x: torch.Tensor, y: torch.Tensor) -> None:
        cfg = self.cfg
        lr = plain_lr(step, self.steps, cfg["lr"], cfg["warmup"], cfg["min_lr_ratio"])
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr
        logits = self.model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg["grad_clip"])
        for optimizer in self.optimizers:
            optimizer.step()
        self.losses.append(loss.item())

    def final_loss(self) -> float:
        """The mean training loss of the last 10 steps (as posenc's ``final_loss``)."""
        return sum(self.losses[-10:]) / len(self.losses[-10:])


def plain_train(model: PlainGPT, batches, cfg: dict[str, Any]) -> float:
    """The whole plain loop over ``batches``; returns its final loss."""
    trainer = PlainTrainer(model, cfg, len(batches))
    for step, (x, y) in enumerate(batches):
        trainer.step(step, x, y)
    return trainer.final_loss()


# --- posenc's side --------------------------------------------------------------------------


def posenc_side(name: str, args, task):
    from posenc.experiments.models import ModelSettings, build_model, encoding_spec
    from posenc.experiments.seeding import derive_seed

    spec = encoding_spec(name, train_len=args.seq_len)
    settings = ModelSettings(dim=args.dim, num_layers=args.layers, num_heads=args.heads)
    model = build_model(
        task.vocab_size, spec, settings, max_len=args.seq_len, seed=derive_seed(0, "init")
    )
    return model, spec


def train_settings(args):
    from posenc.experiments.train import TrainSettings

    return TrainSettings(
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        lr=args.lr,
        warmup=args.steps // 10,  # as a study: steps // 10
        optimizer=args.optimizer,
    )


# --- the check: one model -------------------------------------------------------------------


def check_same_model(name, ours, plain, batch) -> dict[str, Any]:
    """Parameter counts, then loss, logits and gradients with the same weights."""
    n_ours = sum(p.numel() for p in ours.parameters())
    n_plain = sum(p.numel() for p in plain.parameters())
    plain.load_state_dict(ours.state_dict(), strict=True)  # the same names, all of them
    x, y = batch.tokens, batch.targets
    ours.train(), plain.train()
    ours.zero_grad(set_to_none=True), plain.zero_grad(set_to_none=True)
    lo, lp = ours(x), plain(x)
    loss_ours = F.cross_entropy(lo.reshape(-1, lo.shape[-1]), y.reshape(-1))
    loss_plain = F.cross_entropy(lp.reshape(-1, lp.shape[-1]), y.reshape(-1))
    loss_ours.backward(), loss_plain.backward()
    grads_plain = dict(plain.named_parameters())
    grad_err = max(
        float((p.grad - grads_plain[n].grad).abs().max() / p.grad.abs().max().clamp_min(1e-12))
        for n, p in ours.named_parameters()
    )
    logit_err = float((lo - lp).detach().abs().max())
    loss_err = abs(loss_ours.item() - loss_plain.item())
    ok = (
        n_ours == n_plain
        and loss_err <= 1e-5 * abs(loss_plain.item()) + 1e-6
        and logit_err <= 1e-4
        and grad_err <= 1e-4
    )
    print(
        f"{name:<11} params {n_ours} / {n_plain}   loss {loss_ours.item():.7f} / "
        f"{loss_plain.item():.7f} (|diff| {loss_err:.1e})   max |logits diff| {logit_err:.1e}"
        f"   max grad diff / max grad {grad_err:.1e}   {'same' if ok else 'DIFFERENT'}"
    )
    ours.zero_grad(set_to_none=True), plain.zero_grad(set_to_none=True)
    return {
        "encoding": name,
        "params_posenc": n_ours,
        "params_plain": n_plain,
        "loss_posenc": loss_ours.item(),
        "loss_plain": loss_plain.item(),
        "loss_abs_diff": loss_err,
        "logits_max_abs_diff": logit_err,
        "grad_max_rel_diff": grad_err,
        "same": ok,
    }


# --- timing ---------------------------------------------------------------------------------


def run(args) -> dict[str, Any]:
    from posenc.experiments.tasks import make_task
    from posenc.experiments.train import train

    task = make_task("lm")
    settings = train_settings(args)
    cfg = {
        "lr": settings.lr,
        "warmup": settings.warmup,
        "min_lr_ratio": settings.min_lr_ratio,
        "weight_decay": settings.weight_decay,
        "grad_clip": settings.grad_clip,
        "optimizer": settings.optimizer,
    }
    from posenc.experiments.schedule import warmup_cosine  # the plain schedule is the same

    for step in range(settings.steps):
        ours = warmup_cosine(
            step,
            steps=settings.steps,
            peak=settings.lr,
            warmup=settings.warmup,
            min_ratio=settings.min_lr_ratio,
        )
        if ours != plain_lr(
            step, settings.steps, settings.lr, settings.warmup, settings.min_lr_ratio
        ):
            sys.exit(f"the plain lr schedule differs from posenc's at step {step}")
    drawn = [
        task.train_batch(step, settings.batch_size, settings.seq_len, seed=settings.seed)
        for step in range(settings.steps)
    ]
    batches = [(b.tokens.contiguous(), b.targets.contiguous()) for b in drawn]  # as get_batch

    print("same model? (posenc's initial weights copied into the plain model)")
    models, checks = {}, []
    for name in args.encodings:
        ours, spec = posenc_side(name, args, task)
        plain = PlainGPT(
            task.vocab_size,
            dim=args.dim,
            n_layer=args.layers,
            n_head=args.heads,
            mlp_ratio=4,
            encoding=name,
            max_len=args.seq_len,
            t5_buckets=spec.get("num_buckets", 32),
            t5_max_distance=spec.get("max_distance", args.seq_len),
        )
        checks.append(check_same_model(name, ours, plain, drawn[0]))
        init = {k: v.clone() for k, v in ours.state_dict().items()}
        models[name] = (ours, plain, init)
    if not all(c["same"] for c in checks):
        print("the two models differ: not timing them")
        sys.exit(1)
    print()

    def posenc_run(name):
        ours, _, init = models[name]
        ours.load_state_dict(init)
        t0, c0 = time.perf_counter(), time.process_time()
        result = train(ours, task, settings)
        return time.perf_counter() - t0, time.process_time() - c0, result.final_loss

    def plain_run(name):
        _, plain, init = models[name]
        plain.load_state_dict(init)
        t0, c0 = time.perf_counter(), time.process_time()
        loss = plain_train(plain, batches, cfg)
        return time.perf_counter() - t0, time.process_time() - c0, loss

    def step_paired(name):
        """One posenc run whose every step is followed by the plain loop's same step."""
        ours, plain, init = models[name]
        ours.load_state_dict(init)
        plain.load_state_dict(init)
        trainer = PlainTrainer(plain, cfg, settings.steps)
        pairs = []

        def on_step(info):  # after posenc's step info.step - 1: the plain one, timed
            t0 = time.perf_counter()
            trainer.step(info.step - 1, *batches[info.step - 1])
            pairs.append((tokens_per_step / info.tokens_per_second, time.perf_counter() - t0))

        train(ours, task, settings, on_step=on_step)
        return pairs

    tokens_per_step = settings.batch_size * settings.seq_len
    loops = {"posenc": posenc_run, "plain": plain_run}
    for name in args.encodings:  # warm-up: the CPU rotary kernel, caches, the allocator
        for fn in loops.values():
            fn(name)
    times: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    losses: dict[tuple[str, str], float] = {}
    for r in range(args.repeats):
        for name in args.encodings:
            order = list(loops) if r % 2 == 0 else list(loops)[::-1]
            for loop in order:
                seconds, cpu_seconds, loss = loops[loop](name)
                times.setdefault((name, loop), []).append(seconds / settings.steps)
                cpu.setdefault((name, loop), []).append(cpu_seconds / settings.steps)
                losses[(name, loop)] = loss
    steps_paired: dict[str, list[tuple[float, float]]] = {}
    for _ in range(args.step_repeats):  # posenc's own per-step time, the plain step after it
        for name in args.encodings:
            steps_paired.setdefault(name, []).extend(step_paired(name))
    rows = []
    for name in args.encodings:
        for loop in loops:
            ts, cs = times[(name, loop)], cpu[(name, loop)]
            rows.append(
                {
                    "encoding": name,
                    "loop": loop,
                    "median_ms_per_step": statistics.median(ts) * 1e3,
                    "min_ms_per_step": min(ts) * 1e3,
                    "max_ms_per_step": max(ts) * 1e3,
                    "tokens_per_s": tokens_per_step / statistics.median(ts),
                    "median_cpu_ms_per_step": statistics.median(cs) * 1e3,
                    "repeats": len(ts),
                    "ms_per_step": [t * 1e3 for t in ts],
                    "cpu_ms_per_step": [c * 1e3 for c in cs],
                    "final_loss": losses[(name, loop)],
                }
            )
        ours, plain = rows[-2], rows[-1]
        paired = [a / b for a, b in zip(ours["ms_per_step"], plain["ms_per_step"], strict=True)]
        ours["ratio_posenc_over_plain"] = ours["median_ms_per_step"] / plain["median_ms_per_step"]
        ours["paired_ratios"] = paired  # each repeat's posenc run over the plain run beside it
        ours["median_paired_ratio"] = statistics.median(paired)
        ours["cpu_ratio_posenc_over_plain"] = (
            ours["median_cpu_ms_per_step"] / plain["median_cpu_ms_per_step"]
        )
        pairs = steps_paired[name]
        ours["step_paired_ms"] = [[a * 1e3, b * 1e3] for a, b in pairs]
        ours["median_step_paired_ratio"] = statistics.median(a / b for a, b in pairs)
    return {"checks": checks, "rows": rows, "settings": {**vars(args), **cfg}}


def print_table(rows: list[dict[str, Any]]) -> None:
    """One line per encoding: both loops' medians and posenc / plain."""
    print(
        f"{'encoding':<11} {'posenc ms/step':>14} {'plain ms/step':>13} {'posenc tok/s':>12} "
        f"{'plain tok/s':>11} {'posenc/plain':>12} {'paired':>7} {'steps':>6} {'cpu time':>8} "
        f"{'final loss posenc / plain':>26}"
    )
    for ours, plain in zip(rows[0::2], rows[1::2], strict=True):
        print(
            f"{ours['encoding']:<11} {ours['median_ms_per_step']:>14.2f} "
            f"{plain['median_ms_per_step']:>13.2f} {ours['tokens_per_s']:>12.0f} "
            f"{plain['tokens_per_s']:>11.0f} {ours['ratio_posenc_over_plain']:>12.3f} "
            f"{ours['median_paired_ratio']:>7.3f} {ours['median_step_paired_ratio']:>6.3f} "
            f"{ours['cpu_ratio_posenc_over_plain']:>8.3f} "
            f"{ours['final_loss']:>14.4f} / {plain['final_loss']:.4f}"
        )
    print(
        "\nposenc/plain: median ms/step over median ms/step (whole runs)\n"
        "paired:       the median of each repeat's posenc run over the plain run beside it\n"
        "steps:        the median of posenc's step time (as train() measures it) over the\n"
        "              plain step run right after it (--step-repeats runs of both at once)\n"
        "cpu time:     the first ratio from process CPU time (not the time waiting for a core)"
    )


def machine() -> dict[str, Any]:
    """The machine, as every benchmark here records it (``rope.machine``)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from rope import machine as rope_machine  # the script beside this one

    return rope_machine("cpu")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--encodings",
        nargs="+",
        choices=ENCODINGS,
        default=None,
        help="default: " + " ".join(DEFAULT_ENCODINGS),
    )
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per timed run")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per loop")
    parser.add_argument(
        "--step-repeats", type=int, default=None, help="step-paired runs per encoding"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument(
        "--optimizer",
        choices=("adamw", "muon"),
        default="adamw",
        help="adamw (the presets), or muon on the hidden matrices (posenc report's study)",
    )
    parser.add_argument("--quick", action="store_true", help="8 steps, 3 repeats, no file")
    parser.add_argument(
        "--out",
        default=None,
        help="the JSON file (default: benchmarks/results/train-throughput-<date>.json; "
        "none with --quick)",
    )
    args = parser.parse_args(argv)
    args.encodings = args.encodings or DEFAULT_ENCODINGS
    args.steps = args.steps or (8 if args.quick else 20)
    args.repeats = args.repeats or (3 if args.quick else 11)
    args.step_repeats = args.step_repeats or (1 if args.quick else 5)
    if args.steps < 1 or args.repeats < 1 or args.threads < 1:
        parser.error("--steps, --repeats and --threads must be >= 1")
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(
        f"{args.steps} steps per run, {args.repeats} runs per loop, {args.threads} thread(s), "
        f"batch {args.batch_size} x {args.seq_len}, dim {args.dim}, {args.layers} layers, "
        f"{args.heads} heads, float32\n"
    )
    result = run(args)
    print_table(result["rows"])
    date = datetime.date.today().isoformat()
    out = args.out
    if out is None and not args.quick:
        out = str(RESULTS / f"train-throughput-{date}.json")
    if out:
        document = {
            "benchmark": "train_throughput",
            "date": date,
            "device": "cpu",
            "machine": machine(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "command": "python "
            + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
            "settings": result["settings"],
            "checks": result["checks"],
            "rows": result["rows"],
        }
        with open(out, "w") as f:
            json.dump(document, f, indent=1)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
