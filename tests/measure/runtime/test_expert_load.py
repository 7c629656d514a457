"""Expert token counts (measure/runtime/expert_load.py) for Mixtral / Qwen2-MoE / OLMoE, and the imbalance statistics."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ftscope.measure.runtime.expert_load import ExpertLoad, imbalance_of  # noqa: E402

from .test_hooks import tiny_mixtral, tiny_olmoe, tiny_qwen2_moe  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("build", [tiny_mixtral, tiny_qwen2_moe, tiny_olmoe], ids=["mixtral", "qwen2_moe", "olmoe"])
def test_expert_counts_sum_to_tokens_times_top_k(build) -> None:  # type: ignore[no-untyped-def]
    model = build()
    top_k = model.config.num_experts_per_tok
    b, s = 3, 17
    ids = torch.randint(1, 256, (b, s))
    with ExpertLoad(model) as el:
        model(input_ids=ids, labels=ids).loss.backward()
        model(input_ids=ids[:1])  # a second forward adds up
    assert el.is_moe and len(el.layers) == model.config.num_hidden_layers
    assert el.top_k == top_k
    tokens = (b + 1) * s
    assert el.tokens() == [tokens] * len(el.layers)
    for row in el.counts():
        assert len(row) == el.num_experts[0] and sum(row) == tokens * top_k and min(row) >= 0
    assert el.dropped() == [0] * len(el.layers)
    imb = el.imbalance()
    assert all(v >= 1.0 for v in imb.max_over_mean) and all(v >= 0 for v in imb.cv)
    d = el.to_dict()
    assert d["counts"] == el.counts() and d["top_k"] == top_k
    el.reset()
    assert all(sum(r) == 0 for r in el.counts())


@pytest.mark.slow
def test_expert_load_on_a_dense_model_is_empty() -> None:
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, vocab_size=64)
    el = ExpertLoad(transformers.LlamaForCausalLM(cfg))
    assert not el.is_moe and el.counts() == []


def test_imbalance_definitions() -> None:
    imb = imbalance_of([[4, 0, 0, 0], [2, 2, 2, 2], [3, 1, 3, 1], [0, 0, 0, 0]])
    assert imb.max_over_mean == [4.0, 1.0, 1.5, 0.0]
    # population std: sqrt(((4-1)^2 + 3 * 1^2) / 4) = sqrt(3); of [3,1,3,1]: 1 -> cv 0.5
    assert imb.cv == pytest.approx([3**0.5, 0.0, 0.5, 0.0])
    assert imb.mean_max_over_mean == pytest.approx(6.5 / 4)
