"""Shared-prefix rows (``use_prefix_sharing``): the layout by hand, and the same log-probs, entropy, gradients and
generations as the padded forward on a real tiny model."""

from __future__ import annotations

import pytest
import torch

from roll.config.errors import ConfigError
from roll.config.validation import check_prefix_sharing
from roll.config.worker import GeneratingArgs, WorkerConfig
from roll.models.logprobs import token_log_probs
from roll.models.prefix_sharing import pair_cost, plan_rows, shared_prefix_layout


def _right_padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids, mask = torch.zeros(len(rows), width, dtype=torch.long), torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
    return ids, mask


def test_plan_joins_a_group_and_keeps_unrelated_samples_apart():
    # two samples share [5, 6, 7]; [5, 9] shares one token, which does not pay for the row it would join
    samples = [[5, 6, 7, 1], [5, 6, 7, 2, 3], [5, 9], [8]]
    assert plan_rows(samples, max_row=64) == [(3, [0, 1]), (1, [2]), (1, [3])]
    # identical samples share all but their last token
    assert plan_rows([[4, 4, 4], [4, 4, 4]], max_row=64) == [(2, [0, 1])]
    # the row budget splits a group: 3 + 1 + 1 + 1 tokens would exceed 5
    assert plan_rows([[1, 2, 3, 4]] * 3, max_row=5) == [(3, [0, 1]), (3, [2])]
    # a short shared prefix before long own parts: the joined row saves 2 tokens but its mask makes attention cost
    # 202^2 pairs instead of 2 x 102^2 (per pair 1/64 of a token here): kept apart
    long = [[1, 1] + [2] * 100, [1, 1] + [3] * 100]
    assert plan_rows(long, max_row=1000) == [(2, [0, 1])]
    assert plan_rows(long, max_row=1000, pair=1 / 64) == [(101, [0]), (101, [1])]


def test_layout_by_hand():
    """Samples A = [5 6 7 1], B = [5 6 7 2 3] share [5 6 7]; row: 5 6 7 | 1 | 2 3."""
    ids, mask = _right_padded([[5, 6, 7, 1], [5, 6, 7, 2, 3]])
    lay = shared_prefix_layout(ids, mask)
    assert lay.input_ids.tolist() == [[5, 6, 7, 1, 2, 3]]
    assert lay.position_ids.tolist() == [[0, 1, 2, 3, 3, 4]]
    allowed = lay.allowed[0, 0].int().tolist()
    assert allowed == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],  # A's token sees the prefix and itself
        [1, 1, 1, 0, 1, 0],  # B's first token does not see A's
        [1, 1, 1, 0, 1, 1],
    ]
    # distinct scored positions: prefix 0->6, 1->7 (once), then A: 2->1; B: 2->2, 4->3
    assert lay.src.tolist() == [0, 1, 2, 2, 4]
    assert lay.labels.tolist() == [6, 7, 1, 2, 3]
    # (B, L-1) = (2, 4) frame: A scores its positions 0..2, B its positions 0..3
    assert lay.dest.tolist() == [0, 1, 2, 4, 5, 6, 7]
    assert lay.pick.tolist() == [0, 1, 2, 0, 1, 3, 4]
    mask_f = lay.additive_mask(torch.float32)
    assert mask_f[0, 0, 3, 3] == 0 and mask_f[0, 0, 4, 3] == torch.finfo(torch.float32).min


def test_rows_with_holes_or_nothing_to_share_take_the_padded_path():
    ids = torch.tensor([[5, 6, 0, 7], [5, 6, 7, 0]])
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0]])
    assert shared_prefix_layout(ids, mask) is None
    assert shared_prefix_layout(*_right_padded([[5, 6, 7], [8, 6, 7]])) is None


def _groups(seed: int, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """3 groups of 4 samples (prompts of 7-12 tokens, answers of 1-6, one answer repeated) and a 1-token row."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for g in range(3):
        prompt = torch.randint(3, 500, (7 + 2 * g + g % 2,), generator=gen).tolist()
        for j in range(4):
            answer = torch.randint(3, 500, (int(torch.randint(1, 7, (), generator=gen)),), generator=gen).tolist()
            rows.append(prompt + (rows[-1][len(prompt) :] if j == 3 else answer))
    rows.append([42])
    ids, mask = _right_padded(rows)
    if left:
        for i, r in enumerate(rows):
            ids[i], mask[i] = ids[i].roll(ids.shape[1] - len(r)), mask[i].roll(ids.shape[1] - len(r))
    return ids, mask


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (GPU only)")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("left", [False, True])
def test_same_log_probs_entropy_and_gradients_as_padded(tiny_model_dir, left, device):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).to(device)
    ids, mask = (t.to(device) for t in _groups(0, left))
    weights = torch.randn(ids.shape[0], ids.shape[1] - 1, generator=torch.Generator().manual_seed(1)).to(device)

    def run(share: bool):
        model.zero_grad()
        lp, ent = token_log_probs(model, ids, mask, with_entropy=True, share_prefix=share)
        (lp * weights + 0.1 * ent).sum().backward()
        return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    lp_a, ent_a, grad_a = run(False)
    lp_b, ent_b, grad_b = run(True)
    assert shared_prefix_layout(ids, mask, pair_cost(64)).input_ids.shape[0] == 4  # 3 groups + the 1-token row
    scored = (mask[:, 1:] * mask[:, :-1]).bool()
    assert (lp_b[~scored] == 0).all() and (ent_b[~scored] == 0).all()
    torch.testing.assert_close(lp_b, lp_a, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(ent_b, ent_a, atol=2e-5, rtol=1e-5)
    for name in grad_a:
        torch.testing.assert_close(grad_b[name], grad_a[name], atol=1e-5, rtol=1e-4)


def test_shared_prompt_prefill_generates_the_same(tiny_model_dir):
    """hf_infer with use_prefix_sharing encodes each repeated prompt once: greedy tokens are the same, log-probs
    within float noise, and a prompt that appears once takes the ordinary path."""
    from roll.strategies.base import StrategyContext
    from roll.strategies.hf_infer import HFInferStrategy
    from roll.strategies.registry import strategy_options

    def strategy(share: bool) -> HFInferStrategy:
        config = WorkerConfig()
        config.model_args.model_name_or_path = tiny_model_dir
        config.strategy_args.strategy_name = "hf_infer"
        config.use_prefix_sharing = share
        s = HFInferStrategy(config, 0, 1, options=strategy_options(config))
        s.initialize(StrategyContext(seed=0))
        return s

    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(20, 400, (n,), generator=gen).tolist() for n in (9, 14, 5)]
    batch = [prompts[0]] * 4 + [prompts[1]] * 3 + [prompts[2]]
    args = GeneratingArgs(max_new_tokens=6, temperature=0.0, do_sample=False)
    shared, plain = strategy(True), strategy(False)
    hits = shared._prefill_shared(batch, [(0, None)] * len(batch))
    assert [h[0] for h in hits] == [8] * 4 + [13] * 3 + [0]
    a, b = shared.generate(batch, args), plain.generate(batch, args)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    for x, y in zip(a, b):
        assert max(abs(p - q) for p, q in zip(x.log_probs, y.log_probs)) < 1e-4


def test_config_refuses_what_cannot_share():
    worker = WorkerConfig()
    worker.use_prefix_sharing = True
    check_prefix_sharing(worker, "actor_train")  # deepspeed_train, no packing: fine
    worker.use_sequence_packing = True
    with pytest.raises(ConfigError, match="actor_train.use_prefix_sharing.*use_sequence_packing"):
        check_prefix_sharing(worker, "actor_train")
    worker.use_sequence_packing = False
    worker.model_args.attn_implementation = "flash_attention_2"
    with pytest.raises(ConfigError, match="attn_implementation=flash_attention_2 takes no attention mask"):
        check_prefix_sharing(worker, "actor_train")
    worker.model_args.attn_implementation = None
    worker.strategy_args.strategy_name = "sglang"
    check_prefix_sharing(worker, "actor_infer")  # the strategy's part is its registry entry's, checked at launch


@pytest.mark.parametrize(
    "role, name, why",
    [("actor_infer", "sglang", "radix cache"), ("reference", "megatron_infer", "runs its own forward")],
)
def test_launch_refuses_prefix_sharing_where_the_strategy_entry_says_so(role, name, why):
    """What a strategy does about prefixes is its registry entry's ``prefix_sharing``; the preflight reads it."""
    from types import SimpleNamespace

    from roll.launch.preflight import check_strategies

    worker = WorkerConfig()
    worker.use_prefix_sharing, worker.strategy_args.strategy_name = True, name
    cfg = SimpleNamespace(
        ray_address="auto", **{r: None for r in ("actor_train", "actor_infer", "reference", "critic")}
    )
    setattr(cfg, role, worker)
    with pytest.raises(
        ConfigError,
        match=rf"{role}.use_prefix_sharing=True: {name} .*{why}.*prefix sharing is for "
        r".*deepspeed_infer, deepspeed_train, fsdp2_infer, fsdp2_train, hf_infer",
    ):
        check_strategies(cfg)


def test_auto_is_on_where_it_applies_and_off_where_it_cannot():
    """The default (``auto``) shares prefixes unless packing or a maskless attention rules it out, and, unlike
    ``true``, is no config error there; ``false`` is off."""
    from types import SimpleNamespace

    from roll.config.loader import load_config
    from roll.config.rlvr import RLVRConfig
    from roll.launch.preflight import check_strategies

    worker = WorkerConfig()
    assert worker.use_prefix_sharing == "auto" and worker.shares_prefixes()
    worker.use_sequence_packing = True
    assert not worker.shares_prefixes()
    worker.use_sequence_packing, worker.model_args.attn_implementation = False, "flash_attention_2"
    assert not worker.shares_prefixes()
    worker.model_args.attn_implementation = "sdpa"
    assert worker.shares_prefixes()
    worker.use_prefix_sharing = False
    assert not worker.shares_prefixes()
    # a config that does not name the key gets auto; false from the command line turns it off
    cfg = load_config("rlvr_tiny", overrides=["actor_infer.use_prefix_sharing=false"], schema=RLVRConfig)
    assert cfg.actor_train.use_prefix_sharing == "auto" and cfg.actor_train.shares_prefixes()
    assert cfg.actor_infer.use_prefix_sharing is False and not cfg.actor_infer.shares_prefixes()
    # auto on an engine that shares prefixes itself (SGLang) passes the launch check that true fails
    engine = WorkerConfig()
    engine.strategy_args.strategy_name = "sglang"
    check_strategies(
        SimpleNamespace(ray_address="auto", actor_train=None, actor_infer=engine, reference=None, critic=None)
    )


def _rows_seen(model: torch.nn.Module) -> list[int]:
    """A forward pre-hook on ``model`` that records the number of rows of every forward it runs."""
    seen: list[int] = []

    def hook(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        seen.append(ids.shape[0])

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def test_default_config_runs_shared_rows(tiny_model_dir):
    """With the key left at its default, hf_infer's log-prob pass runs a micro-batch of 2 groups x 4 samples as 2
    shared rows and its prefill encodes each distinct prompt once; the log-probs are those of ``false``. Fails if
    auto were silently off (8 rows)."""
    from roll.data.batch import Batch
    from roll.strategies.base import StrategyContext
    from roll.strategies.hf_infer import HFInferStrategy
    from roll.strategies.registry import strategy_options

    def strategy(**key) -> HFInferStrategy:
        config = WorkerConfig(**key)
        config.model_args.model_name_or_path = tiny_model_dir
        config.strategy_args.strategy_name = "hf_infer"
        s = HFInferStrategy(config, 0, 1, options=strategy_options(config))
        s.initialize(StrategyContext(seed=0))
        return s

    ids, mask = _groups(5)
    ids, mask = ids[:8], mask[:8]  # the first 2 groups of 4
    auto, off = strategy(), strategy(use_prefix_sharing=False)
    seen_auto, seen_off = _rows_seen(auto.model), _rows_seen(off.model)
    batch = Batch({"input_ids": ids, "attention_mask": mask})
    got, want = auto.compute_log_probs(batch)["log_probs"], off.compute_log_probs(batch)["log_probs"]
    assert seen_auto == [2] and seen_off == [8]
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    prompts = [ids[i, :7].tolist() for i in range(8)]  # 2 distinct 7-token prompts, 4 copies each
    seen_auto.clear()
    auto.generate(prompts, GeneratingArgs(max_new_tokens=2, temperature=0.0, do_sample=False))
    assert seen_auto[0] == 2  # the shared prefill: one row per distinct prompt


def test_groups_that_share_only_a_system_prompt_keep_rows_of_their_own():
    """Two groups of 4 (128-token prompts, 116 of them a common system prompt; 64-token replies; hidden size 128):
    joining them through the system prompt makes one 724-token masked row, which measured slower on CPU than a row
    per group (docs/verified.md, "The grid on a quiet machine"); the planner keeps a row per group. With the pair
    cost at half (the FLOP count alone) it joined them."""
    gen = torch.Generator().manual_seed(0)
    system = torch.randint(3, 500, (116,), generator=gen).tolist()
    samples = []
    for _ in range(2):
        prompt = system + torch.randint(3, 500, (12,), generator=gen).tolist()
        samples += [prompt + torch.randint(3, 500, (64,), generator=gen).tolist() for _ in range(4)]
    assert [sorted(members) for _, members in plan_rows(samples, 4 * 192, pair_cost(128))] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
    ]
    assert len(plan_rows(samples, 4 * 192, pair_cost(128) / 2)) == 1
