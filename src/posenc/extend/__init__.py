"""``posenc extend``: a pretrained model measured past its trained context under each RoPE
scaling (none, linear, NTK, dynamic NTK, YaRN; Llama 3 and LongRoPE where its config has
them), with no fine-tuning: perplexity by position, passkey retrieval, wall time and peak
memory per length, and the answer: which scaling to use up to which length."""
