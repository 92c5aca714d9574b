"""Tiny random-weight models saved as transformers folders, for ``posenc extend``'s tests:
a Llama (one set of RoPE parameters) and a Gemma 3 (local and global layer types), each
with a byte-level tokenizer (one token per Latin-1 character, BOS 256), so every code path runs in
seconds without a real checkpoint; and a Llama as a GGUF file (:func:`tiny_llama_gguf`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers

VOCAB = 260  # 256 bytes, BOS, EOS, PAD, one spare
#: What every tiny model shares: 2 layers of width 32, 4 query heads over 2 key-value heads.
SIZES = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
#: The byte tokenizer's BOS, EOS and PAD.
BYTE_IDS = {"bos_token_id": 256, "eos_token_id": 257, "pad_token_id": 258}


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
        **SIZES, **BYTE_IDS, max_position_embeddings=context, tie_word_embeddings=True
    )
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder


def tiny_gemma3(folder: Path, *, context: int = 512, seed: int = 0) -> Path:
    """A 2-layer random Gemma 3 text model (one local layer with a sliding window of 16 at
    base 1e4, one global at 1e6), saved in ``folder``."""
    torch.manual_seed(seed)
    config = transformers.Gemma3TextConfig(
        **SIZES,
        **BYTE_IDS,
        head_dim=8,
        max_position_embeddings=context,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
    )
    transformers.Gemma3ForCausalLM(config).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder


def tiny_llama_gguf(path: Path, *, context: int = 512, seed: int = 0) -> Path:
    """A 2-layer random Llama trained (nominally) at ``context`` tokens, written as the GGUF
    file ``path`` by the ``gguf`` package's writer as llama.cpp's converter lays it out: the
    ``llama.*`` hyperparameters with no ``rope.scaling`` key (as SmolLM2's file), F32
    tensors under llama.cpp's names with q/k permuted as ``convert_hf_to_gguf.py`` permutes
    them, and a sentencepiece-style vocabulary (``<unk>``, ``<s>``, ``</s>``, the 256 byte
    tokens, ``▁``) that transformers' GGUF reader turns into a byte-fallback tokenizer.
    ``AutoModelForCausalLM`` and ``AutoTokenizer`` load it (``gguf_file=``); about 150 kB."""
    import gguf

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        **SIZES,
        max_position_embeddings=context,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    heads, kv_heads, layers = (
        config.num_attention_heads,
        config.num_key_value_heads,
        config.num_hidden_layers,
    )
    weights = {
        k: v.detach().numpy() for k, v in transformers.LlamaForCausalLM(config).state_dict().items()
    }

    def permuted(w: np.ndarray, n: int) -> np.ndarray:  # convert_hf_to_gguf's LlamaModel.permute
        return w.reshape(n, 2, w.shape[0] // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(context)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(config.hidden_size // heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(VOCAB)
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{i:02X}>" for i in range(256)), "\u2581"]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * (VOCAB - 1) + [-1.0])
    writer.add_token_types([2, 3, 3, *([6] * 256), 1])  # unknown, control, byte, normal
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    for i in range(layers):
        hf, blk = f"model.layers.{i}.", f"blk.{i}."
        tensors = {
            "attn_norm": weights[hf + "input_layernorm.weight"],
            "attn_q": permuted(weights[hf + "self_attn.q_proj.weight"], heads),
            "attn_k": permuted(weights[hf + "self_attn.k_proj.weight"], kv_heads),
            "attn_v": weights[hf + "self_attn.v_proj.weight"],
            "attn_output": weights[hf + "self_attn.o_proj.weight"],
            "ffn_norm": weights[hf + "post_attention_layernorm.weight"],
            "ffn_gate": weights[hf + "mlp.gate_proj.weight"],
            "ffn_up": weights[hf + "mlp.up_proj.weight"],
            "ffn_down": weights[hf + "mlp.down_proj.weight"],
        }
        for name, tensor in tensors.items():
            writer.add_tensor(f"{blk}{name}.weight", np.ascontiguousarray(tensor))
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    writer.add_tensor("output.weight", weights["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
