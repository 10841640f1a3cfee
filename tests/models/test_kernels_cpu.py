"""Fused-kernel settings on CPU: the chunk math behind the compiled log-prob pass equals autograd through full
logits (values and both gradients, hand-derived in :func:`roll.models.logprobs.logit_grad`), ``compile_log_probs``
only compiles on CUDA, and ``use_liger_kernel`` fails with the key's name where it cannot run."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from roll.config.errors import ConfigError
from roll.config.loader import load_config
from roll.config.rlvr import RLVRConfig
from roll.launch.preflight import check_kernels
from roll.models.logprobs import _kernels, _logit_grad_eager, logit_grad, logit_stats


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_chunk_math_equals_autograd_through_full_logits(temperature):
    gen = torch.Generator().manual_seed(0)
    logits = (2 * torch.randn(6, 50, generator=gen, dtype=torch.float64)).requires_grad_(True)
    labels = torch.tensor([0, 3, 49, 7, 7, 20])
    z = logits / temperature
    want_lp = torch.log_softmax(z, -1).gather(-1, labels[:, None]).squeeze(-1)
    p = torch.softmax(z, -1)
    want_ent = -(p * torch.log_softmax(z, -1)).sum(-1)
    g_lp, g_ent = torch.randn(6, generator=gen, dtype=torch.float64), torch.randn(6, generator=gen, dtype=torch.float64)
    (want_grad,) = torch.autograd.grad((want_lp * g_lp + want_ent * g_ent).sum(), logits, retain_graph=True)

    lp, log_z, ent = logit_stats(logits.detach(), labels, temperature, True)
    torch.testing.assert_close(lp.double(), want_lp.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent.double(), want_ent.detach(), atol=1e-5, rtol=1e-5)
    (want_lp_only,) = torch.autograd.grad((want_lp * g_lp).sum(), logits)
    for grad_fn in (logit_grad, _logit_grad_eager):  # the compile target and the in-place eager form
        grad = grad_fn(
            logits.detach().clone(), labels, log_z, ent, g_lp.float(), g_ent.float(), temperature, torch.float64
        )
        torch.testing.assert_close(grad, want_grad, atol=1e-5, rtol=1e-4)
        # without the entropy term: only d lp / dz
        grad = grad_fn(logits.detach().clone(), labels, log_z, ent, g_lp.float(), None, temperature, torch.float64)
        torch.testing.assert_close(grad, want_lp_only, atol=1e-5, rtol=1e-4)


def test_compilation_is_cuda_only():
    assert _kernels(torch.device("cpu"), compiled=True) == (logit_stats, _logit_grad_eager)
    assert _kernels(torch.device("cpu"), compiled=False) == (logit_stats, _logit_grad_eager)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU error")
def test_liger_on_cpu_names_the_key(tmp_path):
    from transformers import AutoModelForCausalLM, Qwen2Config

    from roll.models.loading import load_causal_lm

    AutoModelForCausalLM.from_config(
        Qwen2Config(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            vocab_size=64,
        )
    ).save_pretrained(tmp_path)
    with pytest.raises(RuntimeError, match="model_args.use_liger_kernel: .*need a CUDA GPU"):
        load_causal_lm(str(tmp_path), use_liger_kernel=True)


def test_preflight_refuses_liger_without_gpus_or_package():
    cfg = load_config("rlvr_tiny", None, ["actor_train.model_args.use_liger_kernel=true"], RLVRConfig)
    with pytest.raises(
        ConfigError,
        match=r"actor_train.model_args.use_liger_kernel=True: Liger's kernels run on "
        r"CUDA GPUs; give actor_train a device_mapping",
    ):
        check_kernels(cfg)
    cfg.actor_train.device_mapping = [0]
    if importlib.util.find_spec("liger_kernel") is None:
        with pytest.raises(ConfigError, match="the liger-kernel package is not installed; pip install liger-kernel"):
            check_kernels(cfg)
    else:
        check_kernels(cfg)


def test_gpu_example_turns_on_liger_and_compiled_log_probs():
    cfg = load_config("rlvr_qwen05b_gpu", None, [], RLVRConfig)
    assert cfg.actor_train.model_args.use_liger_kernel and cfg.actor_train.model_args.compile_log_probs
    assert cfg.actor_train.max_tokens_per_microbatch_in_train == 24576
