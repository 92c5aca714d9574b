"""Tiny random-weight models saved as transformers folders, for ``posenc extend``'s tests:
a Llama (one set of RoPE parameters) and a Gemma 3 (local and global layer types), each
with a byte-level tokenizer (one token per Latin-1 character, BOS 256), so every code path runs in
seconds without a real checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

VOCAB = 260  # 256 bytes, BOS, EOS, PAD, one spare


def byte_tokenizer() -> transformers.PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {chr(i): i for i in range(256)}  # Latin-1 characters; anything else is <unk>
    vocab.update({"<s>": 256, "</s>": 257, "<pad>": 258, "<unk>": 259})
    model = models.WordPiece(vocab, unk_token="<unk>", max_input_chars_per_word=1)
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 256)]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
    )


def tiny_llama(folder: Path, *, context: int = 512, seed: int = 0) -> Path:
    """A 2-layer random Llama trained (nominally) at ``context`` tokens, saved in ``folder``."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
        bos_token_id=256,
        eos_token_id=257,
        pad_token_id=258,
        tie_word_embeddings=True,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder


def tiny_gemma3(folder: Path, *, context: int = 512, seed: int = 0) -> Path:
    """A 2-layer random Gemma 3 text model (one local layer with a sliding window of 16 at
    base 1e4, one global at 1e6), saved in ``folder``."""
    torch.manual_seed(seed)
    config = transformers.Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=context,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
        bos_token_id=256,
        eos_token_id=257,
        pad_token_id=258,
    )
    transformers.Gemma3ForCausalLM(config).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder
