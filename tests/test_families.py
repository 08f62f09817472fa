"""The families interpretability studies, against Hugging Face transformers on random weights: GPT-NeoX
(Pythia), Qwen2, Gemma and Mistral, several shapes each (GQA where the family has it). The residual stream
after every block and the logits agree to 1e-5, greedy decoding with the KV cache is token-identical to
transformers' generate, and a lumen model written as a HF directory loads in transformers."""


import json

import pytest
import torch
import torch.nn.functional as F
from transformers import GemmaConfig, Qwen2Config

from helpers.families import HF_CLASSES, SHAPES, V
from lumen import GPT, ModelConfig
from lumen.accounting import count, formula, forward_flops_per_token
from lumen.block import BranchOutputNormBlock, ParallelBlock
from lumen.errors import ConfigError, ModelFileError, UserError
from lumen.formats import load
from lumen.formats.hf import config_from_hf, config_to_hf, from_hf_model, save_hf_dir
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
PUBLISHED |= {  # families-b: the model cards' totals (Gemma 2: its technical report; SmolLM3: the hub's count)
    "gemma2-2b": 2_614_341_888, "gemma2-9b": 9_241_705_984, "smollm3-3b": 3_075_098_624,
    "gemma3-270m": 268_098_176, "gemma3-1b": 999_885_952, "qwen3-30b-a3b": 30_532_122_624,
    "olmoe-1b-7b": 6_919_161_856,  # OLMoE-1B-7B-0924: the hub lists 6.92B (its name: "1B active, 7B total")
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


@pytest.mark.parametrize("name", FAMILIES_A + ("olmoe-1b-7b",))
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


# --- families-b: Gemma 2, SmolLM3 (and later Gemma 3, the mixture of experts) against transformers -------------
# tiny random-weight models from transformers' own config classes (helpers.families.SHAPES); every test below
# runs on each of them

FAMILIES_B = [n for n in SHAPES if n.split("-")[0] in ("gemma2", "smollm3", "gemma3", "qwen3moe", "olmoe")]
# the first shape of each family in the default tier, the others in the slow one (the default tier's budget)
_FIRST = {n.split("-")[0]: n for n in reversed(FAMILIES_B)}.values()
FAMILIES_B = [n if n in _FIRST else pytest.param(n, marks=pytest.mark.slow) for n in FAMILIES_B]


def _hf_and_lumen(name, dtype=torch.float32):
    torch.manual_seed(0)
    hf = SHAPES[name]().eval()
    hf.config._attn_implementation = "eager"
    hf.config._experts_implementation = "eager"  # (the expert loop: its grouped matmul has no float64)
    with torch.no_grad():  # HF inits norms to 0/1: randomise them so that they are tested too
        for p in hf.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    ours = from_hf_model(hf)
    return hf.to(dtype), ours.to(dtype)


def _relative(a, b):
    """||a - b|| / ||b|| over all the logits."""
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("name", FAMILIES_B)
def test_family_logits_match_transformers_in_float32_float64_and_bfloat16(name):
    idx = torch.randint(0, V, (2, 24), generator=torch.Generator().manual_seed(1))
    errors, logits = {}, {}
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        hf, ours = _hf_and_lumen(name, dtype)
        with torch.no_grad():
            logits[dtype] = ours(idx)[0].double(), hf(idx).logits.double()
        errors[dtype] = _relative(*logits[dtype])
    # float64: what is left is float32 rounding inside both (HF's Gemma norms, both sides' RoPE tables), no bug
    assert errors[torch.float64] < 1e-6, errors
    assert errors[torch.float32] < 5e-5, errors
    # bfloat16: within 1e-2 of transformers; where transformers' own bf16 logits are further than that from the
    # float64 ones (deep Gemma 3 shapes: ~2e-2), lumen's may be no further from them than transformers' are
    truth = logits[torch.float64][1]
    own, theirs = (_relative(x, truth) for x in logits[torch.bfloat16])
    assert errors[torch.bfloat16] < 1e-2 or own <= 1.1 * theirs, (errors, own, theirs)


@pytest.mark.parametrize("name", FAMILIES_B)
def test_family_greedy_decoding_matches_transformers_for_32_steps(name):
    """32 steps past a prompt of 6: well past every tiny window, so the per-layer windows slide in the cache."""
    hf, ours = _hf_and_lumen(name)
    prompt = torch.randint(0, V, (2, 6), generator=torch.Generator().manual_seed(2))
    ref = hf.generate(prompt, max_new_tokens=32, do_sample=False, pad_token_id=0, eos_token_id=None,
                      attention_mask=torch.ones_like(prompt))
    assert torch.equal(ours.generate(prompt, 32, temperature=0), ref)


@pytest.mark.parametrize("name", FAMILIES_B)
def test_family_padded_batch_is_each_prompt_alone(name):
    _, ours = _hf_and_lumen(name)
    g = torch.Generator().manual_seed(4)
    long, short = torch.randint(0, V, (1, 20), generator=g), torch.randint(0, V, (1, 13), generator=g)
    for side in ("left", "right"):
        pad = torch.zeros(1, 7, dtype=torch.long)
        batch = torch.cat((long, torch.cat((pad, short) if side == "left" else (short, pad), dim=1)))
        real = torch.ones_like(batch, dtype=torch.bool)
        if side == "left":
            real[1, :7] = False
        else:
            real[1, 13:] = False
        with torch.no_grad():
            both = ours(batch, mask=real)[0]
            alone_long, alone_short = ours(long)[0], ours(short)[0]
        torch.testing.assert_close(both[0], alone_long[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(both[1][real[1]], alone_short[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", FAMILIES_B)
def test_family_round_trip_through_a_hf_directory(name, tmp_path):
    hf, ours = _hf_and_lumen(name)
    out = save_hf_dir(ours, tmp_path / "model")
    c = json.loads((out / "config.json").read_text())
    assert c["model_type"] == hf.config.model_type
    reloaded_hf = HF_CLASSES[c["model_type"]].from_pretrained(out, attn_implementation="eager").eval()
    back = load(out).model
    idx = torch.randint(0, V, (1, 30), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(reloaded_hf(idx).logits, hf(idx).logits, atol=1e-5, rtol=0)
        assert torch.equal(back(idx)[0], ours(idx)[0])
    assert back.cfg == ours.cfg


def test_a_mixture_of_experts_counts_its_active_parameters():
    """Qwen3-30B-A3B: 30.5B parameters, of which a token uses 3.3B (8 of 128 experts), as its model card says;
    `lumen count` prints both, and its forward FLOPs count the picked experts only."""
    cfg = ModelConfig.from_name("qwen3-30b-a3b")
    c = count(cfg)
    expert = 3 * cfg.d_model * cfg.hidden
    assert c.total - c.active == cfg.n_layers * (cfg.n_experts - cfg.experts_per_token) * expert
    assert 3.3e9 <= c.active < 3.4e9  # (the card: "3.3B activated")
    olmoe = count(ModelConfig.from_name("olmoe-1b-7b"))
    assert 1.2e9 <= olmoe.active < 1.3e9  # (OLMoE's paper: "1.3B active"; its name rounds it to 1B)
    dense = cfg.replace(n_experts=cfg.experts_per_token, name="the same with only 8 experts")
    routers = 2 * cfg.n_layers * cfg.d_model * (cfg.n_experts - cfg.experts_per_token)  # (the only difference)
    assert forward_flops_per_token(cfg, 1)["weights"] - forward_flops_per_token(dense, 1)["weights"] == routers


# --- families-b: every looking-inside tool on each of its families (tiny presets) ----------------------------------
TOOLS_B = {  # each preset shrunk, its details kept (and made to bite: small windows, small caps, few experts)
    "gemma2-2b": dict(n_layers=3, n_kv_heads=2, d_head=16, sliding_window=5, attn_softcap=2.0, final_softcap=3.0),
    "gemma3-1b": dict(n_layers=7, n_kv_heads=2, d_head=16, sliding_window=5, rope_theta=1000.0, rope_local_theta=10.0),
    "smollm3-3b": dict(n_layers=4, n_kv_heads=2, rope_layers=(True, False)),
    "qwen3-30b-a3b": dict(n_layers=2, n_kv_heads=2, d_head=16, n_experts=4, experts_per_token=2),
    "olmoe-1b-7b": dict(n_layers=2, n_kv_heads=2, n_experts=4, experts_per_token=2),
}


def _tiny_b(name):
    torch.manual_seed(0)
    cfg = ModelConfig.from_name(name).replace(vocab_size=V, context=64, d_model=32, n_heads=4, d_ff=64,
                                              **TOOLS_B[name])
    model = GPT(cfg)
    with torch.no_grad():  # norms away from their init, so that they matter
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


@pytest.mark.parametrize("name", TOOLS_B)
def test_every_tool_runs_on_each_family_and_the_stream_adds_up(name):
    from lumen.inspect import activation_names, attribute, decompose
    from lumen.inspect.hooks import run_with_hooks

    model, cfg = _tiny_b(name), _tiny_b(name).cfg
    x = torch.randint(0, V, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits = model(x)[0]
    # every site: an identity hook anywhere leaves the logits as they are
    every = activation_names(model, every=True)
    assert torch.allclose(run_with_hooks(model, x, [(lambda n: True, lambda a, n: None)]), logits, atol=1e-5)
    _, cache = run_with_cache(model, x, every)
    # attn_out and mlp_out are what each block adds to the stream (after a sandwich's post norms)
    for i in range(cfg.n_layers):
        pre, mid, post = (cache[f"blocks.{i}.{k}"] for k in ("resid_pre", "resid_mid", "resid_post"))
        torch.testing.assert_close(cache[f"blocks.{i}.attn_out"], mid - pre, atol=1e-5, rtol=0)
        torch.testing.assert_close(cache[f"blocks.{i}.mlp_out"], post - mid, atol=1e-5, rtol=0)
    # the router: its logits are router(ln2(resid_mid)), its choices their top k
    if cfg.n_experts:
        b = model.blocks[1]
        router = b.mlp.router(b.ln2(cache["blocks.1.resid_mid"]))
        torch.testing.assert_close(cache["blocks.1.router_logits"], router, atol=1e-5, rtol=0)
        assert torch.equal(cache["blocks.1.expert_choices"].sort(-1).values,
                           router.topk(cfg.experts_per_token).indices.sort(-1).values)
        with pytest.raises(UserError, match="mixture of 4 experts"):
            run_with_cache(model, x, ["blocks.0.mlp_hidden"])
    # q/k after their norms: the norm of q (Gemma 3, Qwen3-MoE), or q itself
    a = model.attention(0)
    q, qn = cache["blocks.0.q"], cache["blocks.0.q_normed"]
    torch.testing.assert_close(qn, a.q_norm(q) if cfg.qk_norm else q, atol=1e-6, rtol=0)
    # windows by layer: a sliding block reads nothing outside its window, a full block does
    far = torch.ones(20, 20, dtype=torch.bool).tril(-(cfg.sliding_window or 99))
    for i in range(cfg.n_layers):
        pattern = cache[f"blocks.{i}.attn_pattern"]
        assert torch.all(pattern[..., far] == 0) == (cfg.window(i) is not None or not far.any()), i
    # the final logits: soft-capped if the family caps them; the decomposition adds up to what the cap squashes
    pre_cap = logits if cfg.final_softcap is None else cfg.final_softcap * torch.atanh(logits / cfg.final_softcap)
    if cfg.final_softcap is not None:
        assert logits.abs().max() < cfg.final_softcap and (pre_cap - logits).abs().max() > 1e-3
    for heads in (False, True):
        s = decompose(model, x, heads=heads)
        torch.testing.assert_close(s.logit_diff(5, 9).sum(0), (pre_cap[..., 5] - pre_cap[..., 9]).double(),
                                   atol=1e-4, rtol=0)
    att = attribute(model, x[0], target=7)
    torch.testing.assert_close(att.values.sum(0), pre_cap[0, :, 7].double(), atol=1e-4, rtol=0)
    torch.testing.assert_close(att.heads.sum(1) + att.attn_bias,
                               att.values[[att.components.index(f"blocks.{i}.attn") for i in range(cfg.n_layers)]],
                               atol=1e-5, rtol=0)
    # logit lens: its last row is the model's own (capped) output; tuned lens: at the last layer, the same
    r = logit_lens(model, x[0], k=3)
    assert r.kl[-1].abs().max() < 1e-5 and torch.equal(r.top_ids[-1], logits[0].topk(3).indices)


@pytest.mark.slow
@pytest.mark.parametrize("name", TOOLS_B)
def test_the_heavier_tools_run_on_each_family(name):
    """Tuned lens, neurons (per expert for a mixture), head scores, activation and attribution patching."""
    from lumen.inspect import attribution_patching, patching_maps
    from lumen.inspect.hooks import run_with_hooks
    from lumen.model import plain_attention

    model = _tiny_b(name)
    cfg = model.cfg
    x = torch.randint(0, V, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits = model(x)[0]
    _, cache = run_with_cache(model, x, lambda n: True)
    g = torch.Generator().manual_seed(4)
    lens = train_tuned_lens(model, iter(torch.randint(0, V, (4, 4, 16), generator=g)), 4)
    tuned, plain = evaluate_lens(model, lens, [x]), evaluate_lens(model, LogitLens(model), [x])
    assert tuned["kl"][-1] == pytest.approx(plain["kl"][-1], abs=1e-6)
    # neurons (per expert for a mixture): the top activations are the brute-force top k of the units
    expert = 1 if cfg.n_experts else None
    values, _ = top_activations(model, x, layer=1, k=4, batch=1, expert=expert)
    h = model.blocks[1].ln2(cache["blocks.1.resid_mid"])
    mlp = model.blocks[1].mlp.experts[1] if expert is not None else model.blocks[1].mlp
    hidden = mlp.act(mlp.w_gate(h)) * mlp.w_up(h) if hasattr(mlp, "act") else F.silu(mlp.w_gate(h)) * mlp.w_up(h)
    if expert is not None:  # only the tokens routed to the expert count
        hidden = hidden.masked_fill(~(cache["blocks.1.expert_choices"] == expert).any(-1, keepdim=True), -torch.inf)
    torch.testing.assert_close(values, hidden.flatten(0, 1).topk(4, dim=0).values.T, atol=1e-5, rtol=0)
    assert value_logits(model, 1, 3, expert=expert).shape == (V,)
    # head scores: previous-token attention as the cached pattern shows it
    scores = head_scores(model, x, n_random=2, half=8, seed=5)
    with plain_attention(model):
        pattern = cache.stack("attn_pattern")
    prev = torch.stack([pattern[..., t, t - 1] for t in range(2, 20)], -1).mean((1, 3))
    torch.testing.assert_close(scores["previous_token"], prev, atol=1e-6, rtol=0)
    # patching: a cell is the fraction of the logit difference restored by pasting the clean activation in, as
    # a hooked run of the corrupted prompt gives it; attribution patching estimates maps of the same shapes
    clean, corrupt = x[0], x[1]
    exact = patching_maps(model, clean, corrupt, kinds=("resid_pre", "attn_out", "mlp_out"))
    ans, wrong = int(logits[0, -1].argmax()), int(logits[1, -1].argmax())

    def metric(lg):
        return float((lg[0, -1, ans] - lg[0, -1, wrong]).detach())

    def paste(a, n):
        a = a.clone()
        a[:, -1] = cache["blocks.1.mlp_out"][0, -1]
        return a

    patched = run_with_hooks(model, corrupt[None], [("blocks.1.mlp_out", paste)])
    m_clean, m_bad = metric(logits[:1]), metric(logits[1:])
    assert exact.maps["mlp_out"][1, -1] == pytest.approx((metric(patched) - m_bad) / (m_clean - m_bad), abs=1e-4)
    estimate = attribution_patching(model, clean, corrupt, kinds=("resid_pre", "attn_out", "mlp_out"))
    assert estimate.maps["resid_pre"].shape == exact.maps["resid_pre"].shape


def test_the_families_page_is_generated_from_the_presets():
    """docs/families.md is `python -m lumen.formats.families docs/families.md`'s output for today's presets, and every
    family lumen reads from Hugging Face has its row."""
    from pathlib import Path

    from lumen.formats import families
    from lumen.formats.hf import FAMILIES

    page = (Path(__file__).resolve().parents[1] / "docs" / "families.md").read_text()
    assert page == families.page() + "\n", "stale: run python -m lumen.formats.families docs/families.md"
    rows = {line.split(" | ")[0].lstrip("| ") for line in page.splitlines() if line.startswith("| ")}
    assert set(FAMILIES) - {"phi3"} <= rows  # (Phi-3 is read, and written back as Llama or Mistral)


@pytest.mark.slow
@pytest.mark.parametrize("name", TOOLS_B)
def test_the_explorer_page_builds_for_each_family(name):
    """The explorer's numbers (lenses, attribution, a patching map) for a tiny model of each family; the logit
    lens it shows ends at the model's own top prediction."""
    from lumen.report.explore import explore_data
    from lumen.tokenizers import CharTokenizer

    model = _tiny_b(name)
    tok = CharTokenizer.from_text("".join(chr(i) for i in range(32, 32 + V)))
    page = explore_data(model, tok, "hello world", contrast=("a", "b"), corrupt="jello world",
                        patch_kinds=("resid_pre",))
    assert {"attribution", "lenses", "ids"} <= set(page)
    with torch.no_grad():
        top = model(torch.tensor([tok.encode("hello world")]))[0][0].argmax(-1)
    assert logit_lens(model, tok.encode("hello world"), k=1).top_ids[-1][:, 0].tolist() == top.tolist()


def test_lumen_convert_writes_phi3_unfused_and_transformers_reads_it_back(tmp_path, capsys):
    """Phi-3's files fuse W_Q, W_K, W_V (qkv_proj) and W_gate, W_up (gate_up_proj); lumen holds them apart and
    `lumen convert --to hf` writes them apart, as Mistral (Phi-3's math, Llama's layout, its window): the
    directory loads in transformers and gives the original Phi-3's logits."""
    import transformers

    from lumen.cli import main

    torch.manual_seed(0)
    phi3 = SHAPES["phi3-window"]().eval()
    phi3.save_pretrained(tmp_path / "phi3")
    assert any("qkv_proj" in k for k in phi3.state_dict()) and any("gate_up_proj" in k for k in phi3.state_dict())
    assert main(["convert", str(tmp_path / "phi3"), str(tmp_path / "out"), "--to", "hf"]) == 0
    capsys.readouterr()
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="eager").eval()
    names = set(back.state_dict())
    assert back.config.model_type == "mistral" and not any("qkv_proj" in k or "gate_up_proj" in k for k in names)
    idx = torch.randint(0, V, (1, 30), generator=torch.Generator().manual_seed(6))  # (past the window of 7)
    with torch.no_grad():
        torch.testing.assert_close(back(idx).logits, phi3(idx).logits, atol=1e-5, rtol=0)
