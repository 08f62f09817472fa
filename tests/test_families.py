"""The families interpretability studies, against Hugging Face transformers on random weights: GPT-NeoX
(Pythia), Qwen2, Gemma and Mistral, several shapes each (GQA where the family has it). The residual stream
after every block and the logits agree to 1e-5, greedy decoding with the KV cache is token-identical to
transformers' generate, and a lumen model written as a HF directory loads in transformers."""


import pytest
import torch
import torch.nn.functional as F
from transformers import GemmaConfig, Qwen2Config

from helpers.families import V
from lumen import GPT, ModelConfig
from lumen.accounting import count, formula
from lumen.block import BranchOutputNormBlock, ParallelBlock
from lumen.errors import ConfigError, ModelFileError, UserError
from lumen.formats.hf import config_from_hf, config_to_hf
from lumen.inspect import (
    LogitLens,
    attribute,
    deletion_table,
    evaluate_lens,
    head_scores,
    logit_lens,
    run_with_cache,
    run_with_hooks,
    top_activations,
    train_tuned_lens,
    value_logits,
)

# --- the chapter's accounting -------------------------------------------------------------------------

PUBLISHED = {  # total parameters as the model cards / the Pythia paper give them
    "pythia-70m": 70_426_624, "qwen2-0.5b": 494_032_768, "gemma-2b": 2_506_172_416, "mistral-7b": 7_241_732_096,
}


# families-a: the totals of the model cards / the hub's safetensors headers. GPT-J's card says 6,053,381,344, 2,498,560
# more than the tensors transformers' GPTJForCausalLM (and the hub's checkpoint) hold: the test below counts those
PUBLISHED |= {
    "llama3.2-1b": 1_235_814_400, "llama3.2-3b": 3_212_749_824, "llama3.1-8b": 8_030_261_248,
    "qwen2.5-0.5b": 494_032_768, "qwen2.5-1.5b": 1_543_714_304, "qwen2.5-7b": 7_615_616_512,
    "qwen3-0.6b": 596_049_920, "qwen3-1.7b": 1_720_574_976, "olmo2-7b": 7_298_617_344, "phi3-mini": 3_821_079_552,
    "phi-2": 2_779_683_840, "gpt-j-6b": 6_050_882_784,
}
FAMILIES_A = ("llama3.2-1b", "llama3.1-8b", "qwen2.5-0.5b", "qwen3-0.6b", "olmo2-7b", "phi3-mini", "phi-2", "gpt-j-6b")


@pytest.mark.parametrize("name", FAMILIES_A)
def test_count_equals_transformers_own_model_of_the_preset(name):
    """The preset written as config.json and built by transformers (on the meta device: shapes only) has the
    same parameters, tensor by tensor in total, as lumen's count: an independent count of the real architecture."""
    import transformers

    cfg = ModelConfig.from_name(name)
    hf_cfg = config_to_hf(cfg)
    with torch.device("meta"):
        model = getattr(transformers, hf_cfg["architectures"][0])(
            transformers.AutoConfig.for_model(**hf_cfg))
    assert sum(p.numel() for p in model.parameters()) == count(cfg).total


@pytest.mark.parametrize("name", PUBLISHED)
def test_count_is_the_published_total_and_the_formula_counts_the_weight_matrices(name):
    cfg = ModelConfig.from_name(name)
    c = count(cfg)
    assert c.total == PUBLISHED[name]
    # the formula (weights only) is exactly the blocks' matrices: the matmul weights but the unembedding
    assert formula(cfg).non_embedding == c.matmul - cfg.vocab_size * cfg.d_model


@pytest.mark.parametrize("name, published", [("pythia-70m", 18_915_328), ("pythia-160m", 85_056_000)])
def test_non_embedding_count_leaves_out_an_untied_unembedding(name, published):
    """The Pythia paper's non-embedding parameters: the total without embed_in and embed_out (untied)."""
    c = count(ModelConfig.from_name(name))
    assert c.unembedding > 0 and c.non_embedding == published


# --- the looking-inside tools on each family ------------------------------------------------------------

TINY = dict(vocab_size=V, context=64, d_model=32, n_layers=3, n_heads=4, d_ff=64)
FAMILY_PRESETS = {"pythia-70m": {}, "qwen2-0.5b": {"n_kv_heads": 2}, "gemma-2b": {"n_kv_heads": 1, "d_head": 16},
                  "mistral-7b": {"n_kv_heads": 2, "sliding_window": 6}}
# families-a (d_head 8 and rotary 0.5: GPT-J's and Phi-2's partial RoPE rotates 4 of each head's features)
FAMILY_PRESETS |= {"llama3.2-1b": {"n_kv_heads": 2, "d_head": None}, "qwen3-0.6b": {"n_kv_heads": 2, "d_head": 8},
                   "olmo2-7b": {"n_kv_heads": 2}, "phi3-mini": {"n_kv_heads": 2, "sliding_window": 6},
                   "phi-2": {"rotary_fraction": 0.5}, "gpt-j-6b": {"rotary_fraction": 0.5}}


def _tiny(name):
    torch.manual_seed(0)
    model = GPT(ModelConfig.from_name(name).replace(**TINY, **FAMILY_PRESETS[name]))
    with torch.no_grad():  # norms and biases away from their init, so that they matter
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


@torch.no_grad()
def _manual_loss(model, x, skip=None):
    """The next-token loss, with block `skip` left out, written out from the model's parts."""
    h = model.embed(x[:, :-1])
    for i, b in enumerate(model.blocks):
        h = h if i == skip else b(h)
    logits = model.lm_head(model.ln_f(h))
    return F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()).item()


@pytest.mark.parametrize("name", FAMILY_PRESETS)
def test_inspection_tools_run_on_each_family(name):
    model = _tiny(name)
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, V, (2, 20), generator=g)
    logits, cache = run_with_cache(model, x)
    parallel = isinstance(model.blocks[0], ParallelBlock)
    assert parallel == (model.cfg.norm_placement.startswith("parallel")) and ("blocks.0.resid_mid" in cache) != parallel
    if parallel:
        with pytest.raises(UserError, match="parallel block"):
            run_with_cache(model, x, ["blocks.0.resid_mid"])
    # the MLP's hidden units: the input of its down-projection, recomputed from the weights
    b = model.blocks[1]
    h = cache["blocks.1.resid_pre" if parallel else "blocks.1.resid_mid"]
    h = h if isinstance(b, BranchOutputNormBlock) else b.ln2(h)   # (OLMo-2's MLP reads the stream itself)
    if model.cfg.mlp == "mlp":
        act = {"gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[model.cfg.activation]
        hidden = act(F.linear(h, b.mlp.fc.weight, b.mlp.fc.bias))
    else:
        act = (lambda t: F.gelu(t, approximate="tanh")) if name == "gemma-2b" else F.silu
        hidden = act(F.linear(h, b.mlp.w_gate.weight)) * F.linear(h, b.mlp.w_up.weight)
    torch.testing.assert_close(cache["blocks.1.mlp_hidden"], hidden, atol=1e-5, rtol=0)

    # logit lens: its last layer is the model's own output
    r = logit_lens(model, x[0], k=3)
    assert r.kl[-1].abs().max() < 1e-5 and torch.equal(r.top_ids[-1], logits[0].topk(3).indices)
    # tuned lens: trains, and at the last layer it is the logit lens
    lens = train_tuned_lens(model, iter(torch.randint(0, V, (4, 4, 16), generator=g)), 4)
    tuned, plain = evaluate_lens(model, lens, [x]), evaluate_lens(model, LogitLens(model), [x])
    assert tuned["kl"][-1] == pytest.approx(plain["kl"][-1], abs=1e-6)
    # deletion: each row is the loss with that block skipped
    table = deletion_table(model, x)
    assert table["baseline"] == pytest.approx(_manual_loss(model, x), abs=1e-5)
    for row in table["rows"]:
        assert row["loss"] == pytest.approx(_manual_loss(model, x, skip=row["block"]), abs=1e-5)
    # neurons: top activations are the brute-force top-k; a unit's value vector read out through the final
    # norm (gain only: the norm's division scales all logits alike; LayerNorm also centres, its bias adds
    # the same logits to every unit)
    values, _ = top_activations(model, x, layer=1, k=4, batch=1)
    torch.testing.assert_close(values, cache["blocks.1.mlp_hidden"].flatten(0, 1).topk(4, dim=0).values.T)
    v = model.blocks[1].mlp.down.weight[:, 5]
    with torch.no_grad():
        normed = model.ln_f(v) - (model.ln_f.b if parallel else 0)
        scale = torch.sqrt((v.var(unbiased=False) if parallel else v.pow(2).mean()) + model.ln_f.eps)
        # (the unembedding's bias, Phi-2's and GPT-J's, is the same for every unit: not a unit's doing)
        torch.testing.assert_close(value_logits(model, 1, 5), F.linear(normed, model.lm_head.weight) * scale,
                                   atol=1e-4, rtol=1e-4)
    # head scores: previous-token attention as the cached pattern shows it
    scores = head_scores(model, x, n_random=2, half=8, seed=5)
    pattern = cache.stack("attn_pattern")  # (L, B, H, T, S)
    prev = torch.stack([pattern[..., t, t - 1] for t in range(2, 20)], -1).mean((1, 3))
    torch.testing.assert_close(scores["previous_token"], prev, atol=1e-6, rtol=0)
    # direct logit attribution: the writes (and biases) sum to the logit difference, the heads to their block's
    # attention write (through OLMo-2's branch-output norm, its scale frozen), and the stream to the writes
    a = attribute(model, x[0], contrast=(3, 5))
    torch.testing.assert_close(a.values.sum(0), (logits[0, :, 3] - logits[0, :, 5]).double(), atol=1e-5, rtol=0)
    for i in range(model.cfg.n_layers):
        torch.testing.assert_close(a.heads[i].sum(0) + a.attn_bias[i], a.row(f"blocks.{i}.attn"), atol=1e-6, rtol=0)
    writes = cache["embed"] + sum(cache[f"blocks.{i}.attn_out"] + cache[f"blocks.{i}.mlp_out"] for i in range(3))
    torch.testing.assert_close(writes, cache["blocks.2.resid_post"], atol=1e-5, rtol=0)
    if model.cfg.sliding_window:  # nothing outside the window
        T = x.size(1)
        far = torch.ones(T, T, dtype=torch.bool).tril(-model.cfg.sliding_window)
        assert torch.all(pattern[..., far] == 0)


def test_family_settings_that_cannot_work_are_clear_errors():
    with pytest.raises(ConfigError, match="rotary_fraction"):
        ModelConfig(positions="rope", rotary_fraction=1.5)
    with pytest.raises(ConfigError, match="at least 2"):
        ModelConfig(positions="rope", rotary_fraction=0.01)
    with pytest.raises(ConfigError, match="sliding_window must be between 1 and"):
        ModelConfig(sliding_window=0)
    qwen = Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
                       use_sliding_window=True).to_dict()
    with pytest.raises(ModelFileError, match="use_sliding_window"):
        config_from_hf(qwen)
    gemma = GemmaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4).to_dict()
    with pytest.raises(ModelFileError, match="Gemma hidden_act 'relu'"):
        config_from_hf(gemma | {"hidden_act": "relu"})


@pytest.mark.parametrize("name", ["qwen3-0.6b", "olmo2-7b"])
def test_the_q_and_k_sites_after_their_norms_are_the_norm_formulas(name):
    """blocks.i.q_normed and k_normed: an RMSNorm of each head's query/key (Qwen3) or of all heads' together
    (OLMo-2), computed here from the cached q and k and the norms' gains; and a hook there changes the logits."""
    model = _tiny(name)
    x = torch.randint(0, V, (2, 11), generator=torch.Generator().manual_seed(4))
    sites = [f"blocks.{i}.{k}" for i in range(3) for k in ("q", "k", "q_normed", "k_normed")]
    logits, cache = run_with_cache(model, x, sites)
    for i, b in enumerate(model.blocks):
        for kind, norm in (("q", b.attn.q_norm), ("k", b.attn.k_norm)):
            raw = cache[f"blocks.{i}.{kind}"]                                          # (B, T, heads, hd)
            flat = raw.flatten(-2) if model.cfg.qk_norm == "projection" else raw
            want = flat / torch.sqrt(flat.pow(2).mean(-1, keepdim=True) + model.cfg.norm_eps) * norm.g
            torch.testing.assert_close(cache[f"blocks.{i}.{kind}_normed"], want.view_as(raw), atol=1e-5, rtol=0)
    doubled = run_with_hooks(model, x, fwd_hooks=[("blocks.1.q_normed", lambda a, n: 2 * a)])
    assert not torch.allclose(doubled, logits, atol=1e-4)
