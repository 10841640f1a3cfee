"""Build a random-weight Qwen2 with the Qwen2.5-0.5B shape and roll's hub-free tokenizer at PATH (GPU checks).

``python scripts/build_qwen05b_rand.py PATH``: hidden 896, 24 layers, 14 query / 2 KV heads, MLP 4864, vocab
151936, tied embeddings, bf16 (494M parameters); skipped when PATH/config.json exists. Built on the GPU when one
is visible (seconds), else on CPU.
"""

import pathlib
import sys
import time


def main(path: pathlib.Path) -> None:
    if (path / "config.json").is_file():
        print(f"[verify] model already at {path}")
        return
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from roll.models.tiny import build_tokenizer, env_corpus

    start = time.time()
    tok = build_tokenizer(env_corpus(), 1024)
    cfg = Qwen2Config(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        hidden_act="silu",
    )
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    n = sum(p.numel() for p in model.parameters())
    print(f"[verify] built {path}: {n / 1e6:.0f}M parameters in {time.time() - start:.1f}s")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
