"""Layer-type timing (measure/runtime/hooks.py) on synthetic modules with known sleep times and on tiny real
transformers models (the builders are shared with test_expert_load.py)."""
from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
nn = torch.nn

from ftscope.measure.runtime.expert_load import ExpertLoad  # noqa: E402
from ftscope.measure.runtime.hooks import LayerTimer, classify  # noqa: E402

U = 0.03  # time unit of the synthetic modules (seconds); misattribution moves at least 2 U


class _Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fwd_s, bwd_s):  # type: ignore[no-untyped-def]
        ctx.bwd_s = bwd_s
        time.sleep(fwd_s)
        return x * 1.0

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        time.sleep(ctx.bwd_s)
        return g, None, None


class _Leaf(nn.Module):
    def __init__(self, fwd: float, bwd: float) -> None:
        super().__init__()
        self.fwd, self.bwd = fwd, bwd

    def forward(self, x):  # type: ignore[no-untyped-def]
        return _Sleep.apply(x, self.fwd, self.bwd)


class ToyAttention(nn.Module):
    """2U forward / 4U backward of its own, plus a nested LoRA adapter (1U / 2U)."""

    def __init__(self) -> None:
        super().__init__()
        self.own = _Leaf(2 * U, 4 * U)
        self.proj = nn.Module()
        self.proj.lora_A = nn.ModuleDict({"default": _Leaf(1 * U, 2 * U)})

    def forward(self, hidden_states):  # type: ignore[no-untyped-def]
        return self.own(hidden_states) + self.proj.lora_A["default"](hidden_states)


class ToyMLP(_Leaf):
    pass


class ToyRMSNorm(_Leaf):
    pass


class ToyBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = ToyAttention()
        self.mlp = ToyMLP(1 * U, 3 * U)
        self.norm = ToyRMSNorm(1 * U, 2 * U)

    def forward(self, x):  # type: ignore[no-untyped-def]
        h = self.self_attn(hidden_states=x)  # keyword call, as transformers calls attention
        return self.mlp(h) + self.norm(h)  # siblings sharing one input


def test_exclusive_attribution_on_known_sleeps() -> None:
    model = ToyBlock()
    assert classify(model) == {"self_attn": "attention", "self_attn.proj.lora_A.default": "lora", "mlp": "mlp",
                               "norm": "norms"}
    x = torch.randn(8, requires_grad=True)
    with LayerTimer(model) as lt:
        t0 = time.perf_counter()
        model(x).sum().backward()
        wall = time.perf_counter() - t0
    r = lt.result()
    expect_f = {"attention": 2, "lora": 1, "mlp": 1, "norms": 1}
    expect_b = {"attention": 4, "lora": 2, "mlp": 3, "norms": 2}
    # lower bounds only: a sleep never ends early, but a busy machine can wake it late by any amount. Exclusive
    # attribution (nothing counted twice) is the sum below staying within the wall time.
    for cat in expect_f:
        assert expect_f[cat] * U <= r.forward_s[cat], (cat, r.forward_s)
        assert expect_b[cat] * U <= r.backward_s[cat], (cat, r.backward_s)
    assert r.recompute_s == {}
    assert r.calls == {"attention": 1, "lora": 1, "mlp": 1, "norms": 1}
    assert r.sum_s() <= wall
    assert not model.self_attn._forward_pre_hooks and not model.mlp._forward_hooks  # removed on exit


def test_backward_bounded_by_parameters_when_input_needs_no_grad() -> None:
    class WeightedMLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(8))

        def forward(self, x):  # type: ignore[no-untyped-def]
            return _Sleep.apply(x * self.w, 0.0, 3 * U)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mlp = WeightedMLP()
            self.norm = ToyRMSNorm(0.0, 2 * U)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.norm(self.mlp(x))

    net = Net()
    with LayerTimer(net) as lt:
        net(torch.randn(8)).sum().backward()  # input does not require grad: only the weight anchors the end
    r = lt.result()
    assert 3 * U <= r.backward_s["mlp"] < 3.5 * U
    assert 2 * U <= r.backward_s["norms"] < 2.5 * U


def tiny_mixtral(**kw):  # type: ignore[no-untyped-def]
    cfg = transformers.MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2, vocab_size=256, **kw)
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM(cfg)


def tiny_qwen2_moe():  # type: ignore[no-untyped-def]
    cfg = transformers.Qwen2MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                      shared_expert_intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, num_experts=8,
                                      num_experts_per_tok=2, vocab_size=256)
    return transformers.Qwen2MoeForCausalLM(cfg)


def tiny_olmoe():  # type: ignore[no-untyped-def]
    cfg = transformers.OlmoeConfig(hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4, num_experts=8,
                                   num_experts_per_tok=3, vocab_size=256, pad_token_id=0, eos_token_id=1)
    return transformers.OlmoeForCausalLM(cfg)


@pytest.mark.slow
def test_classify_tiny_mixtral() -> None:
    c = classify(tiny_mixtral())
    assert c["model.layers.0.self_attn"] == "attention"
    assert c["model.layers.0.mlp"] == "experts" and c["model.layers.0.mlp.experts"] == "experts"
    assert c["model.layers.0.mlp.gate"] == "router"
    assert c["model.layers.1.input_layernorm"] == "norms" and c["model.norm"] == "norms"
    assert c["model.embed_tokens"] == "embeddings_lm_head" and c["lm_head"] == "embeddings_lm_head"
    assert "model.rotary_emb" not in c
    q = classify(tiny_qwen2_moe())
    assert q["model.layers.0.mlp.shared_expert"] == "experts" and q["model.layers.0.mlp.shared_expert_gate"] == "router"


@pytest.mark.slow
def test_layer_timer_on_tiny_mixtral_step() -> None:
    model = tiny_mixtral()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 256, (2, 32))

    def step() -> float:
        t0 = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
        return time.perf_counter() - t0

    step()  # warm-up outside the timer
    with LayerTimer(model) as lt:
        wall = step() + step()
    r = lt.result()
    for cat in ("attention", "experts", "norms", "router", "embeddings_lm_head"):
        assert r.forward_s.get(cat, 0) > 0, cat
        assert r.backward_s.get(cat, 0) > 0, cat
    assert sum(r.total_s()[c] for c in ("attention", "experts", "norms")) <= wall
    assert r.sum_s() <= wall
    assert r.calls["attention"] == 2 * 2 and r.calls["norms"] == 2 * 5  # two steps
    lt.reset()
    assert lt.result().sum_s() == 0


@pytest.mark.slow
@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_gradient_checkpointing_recompute_and_single_count(reentrant: bool) -> None:
    model = tiny_mixtral()
    model.train()
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    ids = torch.randint(0, 256, (2, 16))
    with LayerTimer(model) as lt, ExpertLoad(model) as el:
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    r = lt.result()
    assert r.recompute_s.get("attention", 0) > 0 and r.recompute_s.get("experts", 0) > 0
    assert r.backward_s.get("attention", 0) > 0
    assert r.calls["attention"] == 2  # recomputation is not a call
    assert el.tokens() == [32, 32] and [sum(row) for row in el.counts()] == [64, 64]  # not doubled


@pytest.mark.slow
def test_lora_adapters_and_quantized_base_layers() -> None:
    peft = pytest.importorskip("peft")
    model = tiny_mixtral()
    cfg = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], target_parameters=["mlp.experts.gate_up_proj"])
    pm = peft.get_peft_model(model, cfg)
    c = classify(pm)
    pre = "base_model.model.model.layers.0."
    assert c[pre + "self_attn.q_proj.lora_A.default"] == "lora" and c[pre + "self_attn.q_proj.lora_B.default"] == "lora"
    assert c[pre + "mlp.experts"] == "lora"  # PEFT ParamWrapper around the fused expert weights
    assert c[pre + "mlp.experts.base_layer"] == "experts"
    ids = torch.randint(0, 256, (2, 16))
    with LayerTimer(pm) as lt, ExpertLoad(pm) as el:
        pm(input_ids=ids, labels=ids).loss.backward()
    r = lt.result()
    for cat in ("lora", "attention", "experts"):
        assert r.forward_s.get(cat, 0) > 0 and r.backward_s.get(cat, 0) > 0, cat
    assert [sum(row) for row in el.counts()] == [32 * 2, 32 * 2]  # hooked through the wrapper

    bnb = pytest.importorskip("bitsandbytes")
    holder = nn.Module()
    holder.q_proj = bnb.nn.Linear4bit(16, 16, bias=False)
    assert classify(holder) == {"q_proj": "quant_linear"}
