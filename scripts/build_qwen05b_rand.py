"""Build a random-weight Qwen2 of a Qwen2.5 shape and roll's hub-free tokenizer at PATH (GPU checks).

``python scripts/build_qwen05b_rand.py PATH [--shape 0.5b|7b]``:

- ``0.5b`` (default): hidden 896, 24 layers, 14 query / 2 KV heads, MLP 4864, vocab 151936, tied embeddings
  (494M parameters);
- ``7b``: hidden 3584, 28 layers, 28 query / 4 KV heads, MLP 18944, vocab 152064, untied embeddings (7.6B
  parameters, 15.2 GB in bf16).

- ``vl3b``: Qwen2.5-VL-3B: the decoder hidden 2048, 36 layers, 16 query / 2 KV heads, MLP 11008, vocab 151936,
  tied embeddings, M-RoPE sections (16, 24, 24); the vision tower 32 blocks of width 1280 (16 heads, MLP 3420, patch
  14, merge 2, window 112, full attention in blocks 7, 15, 23, 31) projected to 2048 (3.75B parameters), with roll's
  hub-free tokenizer plus the image tokens and a Qwen2-VL image processor (:mod:`roll.models.tiny_vl`).

bf16; skipped when PATH/config.json exists. Built on the GPU when one is visible (seconds), else on CPU.
"""

import argparse
import pathlib
import time

#: The Qwen2.5 shapes (Qwen2Config arguments) this script builds.
SHAPES = {
    "0.5b": dict(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "7b": dict(
        hidden_size=3584,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        intermediate_size=18944,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
}


#: Qwen2.5-VL-3B's decoder (Qwen2_5_VLConfig's text_config) and vision tower (vision_config).
VL3B_TEXT = dict(
    hidden_size=2048,
    num_hidden_layers=36,
    num_attention_heads=16,
    num_key_value_heads=2,
    intermediate_size=11008,
    vocab_size=151936,
    max_position_embeddings=128000,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
)
VL3B_VISION = dict(
    depth=32,
    hidden_size=1280,
    intermediate_size=3420,
    num_heads=16,
    out_hidden_size=2048,
    patch_size=14,
    spatial_merge_size=2,
    temporal_patch_size=2,
    window_size=112,
    fullatt_block_indexes=[7, 15, 23, 31],
    tokens_per_second=2,
)


def build_vl(path: pathlib.Path, max_image_pixels: int = 128 * 28 * 28) -> None:
    """The ``vl3b`` shape at ``path`` (random weights, bf16)."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    from roll.models.tiny import env_corpus
    from roll.models.tiny_vl import save_vl_model, vl_config, vl_tokenizer

    start = time.time()
    tok, ids = vl_tokenizer(env_corpus(), 1024)
    cfg = vl_config(tok, ids, VL3B_TEXT, VL3B_VISION)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen2_5_VLForConditionalGeneration(cfg)
    torch.set_default_dtype(torch.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_vl_model(path, model, tok, max_image_pixels)
    n = sum(p.numel() for p in model.parameters())
    print(f"[verify] built {path}: {n / 1e6:.0f}M parameters in {time.time() - start:.1f}s")


def main(path: pathlib.Path, shape: str = "0.5b", config_only: bool = False) -> None:
    """Build the random model of ``shape`` at ``path``; ``config_only``: its config.json and tokenizer, no weights
    (what the memory planner reads, e.g. for a CPU smoke run of a 7B config)."""
    if (path / "config.json").is_file():
        print(f"[verify] model already at {path}")
        return
    if shape == "vl3b":
        build_vl(path)
        return
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from roll.models.tiny import build_tokenizer, env_corpus

    start = time.time()
    tok = build_tokenizer(env_corpus(), 1024)
    cfg = Qwen2Config(
        **SHAPES[shape],
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        hidden_act="silu",
    )
    if config_only:
        path.mkdir(parents=True, exist_ok=True)
        cfg.save_pretrained(path)
        tok.save_pretrained(path)
        print(f"[verify] wrote the {shape} config and tokenizer (no weights) to {path}")
        return
    torch.manual_seed(0)
    if shape != "0.5b":  # initialized in bf16 directly: a 7B model never exists in fp32 (0.5b: as always built)
        torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    torch.set_default_dtype(torch.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    n = sum(p.numel() for p in model.parameters())
    print(f"[verify] built {path}: {n / 1e6:.0f}M parameters in {time.time() - start:.1f}s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=pathlib.Path)
    parser.add_argument("--shape", choices=[*sorted(SHAPES), "vl3b"], default="0.5b")
    parser.add_argument("--config-only", action="store_true", help="config.json and tokenizer only, no weights")
    args = parser.parse_args()
    main(args.path, args.shape, args.config_only)
