"""The looking-inside tools on small random models, against independent references: Hugging Face's
hidden states and attention weights (random GPT-2 and Llama models converted to lumen), the block's
equations recomputed from the weights, and brute-force versions of every reduction."""

import pytest
import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from lumen import GPT, ModelConfig
from lumen.errors import UserError
from lumen.formats.hf import from_hf_model
from lumen.inspect import (
    LogitLens,
    TunedLens,
    activation_names,
    capture,
    delete_blocks,
    deletion_table,
    evaluate_lens,
    head_scores,
    logit_lens,
    replace_activation,
    run_with_cache,
    top_activations,
    train_tuned_lens,
    value_logits,
)
from lumen.inspect.heads import induction_scores, positional_scores
from lumen.inspect.lens import streams

V = 97
HF = {
    "gpt2": lambda: GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=64, n_embd=48, n_layer=3, n_head=4)),
    "llama-gqa": lambda: LlamaForCausalLM(LlamaConfig(
        vocab_size=V, hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64)),
}


def hf_pair(name):
    torch.manual_seed(0)
    hf = HF[name]().eval()
    hf.config._attn_implementation = "eager"
    with torch.no_grad():  # HF inits biases and norms to 0/1: randomise them so they matter
        for p in hf.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return hf, from_hf_model(hf).eval()


def ids(n=24, batch=2, seed=1, vocab=V):
    return torch.randint(0, vocab, (batch, n), generator=torch.Generator().manual_seed(seed))


def tiny(**kw):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=V, context=64, d_model=32, n_layers=3, n_heads=4, d_ff=64, name="tiny").replace(**kw)
    return GPT(cfg).eval()


def no_hooks_left(model):
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


# --- the activation cache ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", HF)
def test_cache_matches_transformers_hidden_states_and_attention(name):
    hf, model = hf_pair(name)
    x = ids()
    with torch.no_grad():
        ref = hf(x, output_hidden_states=True, output_attentions=True)
    logits, cache = run_with_cache(model, x)
    assert list(cache) == activation_names(model)
    L = model.n_layers
    torch.testing.assert_close(cache["embed"], ref.hidden_states[0], atol=1e-5, rtol=0)
    for i in range(L - 1):  # HF's hidden_states[i + 1] is the stream after block i (the last one is normed)
        torch.testing.assert_close(cache[f"blocks.{i}.resid_post"], ref.hidden_states[i + 1], atol=1e-5, rtol=0)
    torch.testing.assert_close(cache["final"], ref.hidden_states[L], atol=1e-5, rtol=0)
    for i in range(L):
        torch.testing.assert_close(cache[f"blocks.{i}.attn_pattern"], ref.attentions[i], atol=1e-6, rtol=0)
    torch.testing.assert_close(logits, ref.logits, atol=1e-5, rtol=0)
    assert no_hooks_left(model) and model.blocks[0].attn.use_sdpa  # the fused path restored


@pytest.mark.parametrize("kw", [{}, {"mlp": "swiglu", "norm": "rmsnorm", "positions": "rope"},
                                {"norm_placement": "post", "activation": "relu"}])
def test_cache_names_follow_the_block_equations(kw):
    model = tiny(**kw)
    x = ids(16, 1, vocab=V)
    _, c = run_with_cache(model, x)
    post_ln = model.cfg.norm_placement == "post"
    for i, b in enumerate(model.blocks):
        pre, mid, out = c[f"blocks.{i}.resid_pre"], c[f"blocks.{i}.resid_mid"], c[f"blocks.{i}.resid_post"]
        prev = c["embed"] if i == 0 else c[f"blocks.{i - 1}.resid_post"]
        assert torch.equal(pre, prev)
        attn_in = pre if post_ln else b.ln1(pre)
        torch.testing.assert_close(c[f"blocks.{i}.attn_out"], b.attn(attn_in), atol=1e-5, rtol=0)
        want_mid = b.ln1(pre + c[f"blocks.{i}.attn_out"]) if post_ln else pre + c[f"blocks.{i}.attn_out"]
        torch.testing.assert_close(mid, want_mid, atol=1e-6, rtol=0)
        h = mid if post_ln else b.ln2(mid)
        if kw.get("mlp") == "swiglu":   # the hidden units, recomputed from the weights
            hidden = F.silu(F.linear(h, b.mlp.w_gate.weight)) * F.linear(h, b.mlp.w_up.weight)
            down = b.mlp.w_down
        else:
            act = F.relu if kw.get("activation") == "relu" else (lambda t: F.gelu(t, approximate="tanh"))
            hidden = act(F.linear(h, b.mlp.fc.weight, b.mlp.fc.bias))
            down = b.mlp.proj
        assert b.mlp.down is down  # the one name for the matrix that writes into the stream
        torch.testing.assert_close(c[f"blocks.{i}.mlp_hidden"], hidden, atol=1e-5, rtol=0)
        torch.testing.assert_close(c[f"blocks.{i}.mlp_out"], down(hidden), atol=1e-5, rtol=0)
        want_out = b.ln2(mid + c[f"blocks.{i}.mlp_out"]) if post_ln else mid + c[f"blocks.{i}.mlp_out"]
        torch.testing.assert_close(out, want_out, atol=1e-6, rtol=0)
        a = c[f"blocks.{i}.attn_pattern"]
        torch.testing.assert_close(a.sum(-1), torch.ones(a.shape[:-1]))
        assert torch.all(a.triu(1) == 0)  # causal: no weight on the future
    torch.testing.assert_close(c["final"], model.ln_f(c[f"blocks.{model.n_layers - 1}.resid_post"]))


def test_caching_changes_nothing_and_costs_nothing_after():
    model = tiny(mlp="swiglu", norm="rmsnorm", positions="rope")
    x = ids(20, 2)
    ref, _ = model(x)
    logits, cache = run_with_cache(model, x, lambda n: not n.endswith(("attn_pattern", "attn_scores")))
    assert torch.equal(logits, ref)  # the fused attention path, unchanged, when no pattern or score is asked for
    assert "blocks.0.attn_pattern" not in cache and "blocks.2.mlp_hidden" in cache
    assert no_hooks_left(model)
    hidden = capture(model, x, "blocks.1.mlp_hidden")
    assert torch.equal(hidden, cache["blocks.1.mlp_hidden"]) and no_hooks_left(model)
    with pytest.raises(UserError, match="unknown activation"):
        run_with_cache(model, x, ["blocks.0.resid"])
    with pytest.raises(ValueError, match="out of range"):
        run_with_cache(model, x, ["blocks.3.resid_post"])


@torch.no_grad()
def manual_forward(model, x, skip=(), patch=None):
    """The model's forward written out by hand: the reference for deletion and replacement."""
    h = model.embed(x)
    for i, b in enumerate(model.blocks):
        if i in skip:
            continue
        h = h + b.attn(b.ln1(h))
        m = b.mlp(b.ln2(h))
        h = h + (patch(i, m) if patch else m)
    return model.lm_head(model.ln_f(h))


def test_delete_blocks_skips_exactly_those_blocks_and_restores_them():
    model = tiny()
    x = ids(16, 2)
    before, _ = model(x)
    with delete_blocks(model, [1]):
        skipped, _ = model(x)
    torch.testing.assert_close(skipped, manual_forward(model, x, skip={1}), atol=1e-5, rtol=0)
    assert not torch.allclose(skipped, before, atol=1e-3)
    after, _ = model(x)
    assert torch.equal(after, before)
    with pytest.raises(ValueError, match="out of range"), delete_blocks(model, 3):
        pass


def test_replace_activation():
    model = tiny()
    x = ids(16, 2)
    with replace_activation(model, "blocks.2.mlp_out", lambda a: 0.5 * a):
        got, _ = model(x)
    want = manual_forward(model, x, patch=lambda i, m: 0.5 * m if i == 2 else m)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    with replace_activation(model, "blocks.0.mlp_out", torch.zeros(32)):
        zeroed, _ = model(x)
    torch.testing.assert_close(zeroed, manual_forward(model, x, patch=lambda i, m: 0 * m if i == 0 else m),
                               atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="cannot be replaced"), replace_activation(model, "blocks.0.resid_mid", 0 * x):
        pass
    assert no_hooks_left(model)


# --- the logit lens ----------------------------------------------------------------------------------

def test_logit_lens_reproduces_the_logits_at_the_last_layer():
    model = tiny(mlp="swiglu", norm="rmsnorm", positions="rope")
    x = ids(20, 1)
    ref, _ = model(x)
    logits, hs = streams(model, x)
    assert torch.equal(logits, ref)
    assert torch.equal(LogitLens(model)(hs[-1], model.n_layers), ref)  # exactly the model's own read-out
    r = logit_lens(model, x[0], k=3)
    assert r.kl[-1].abs().max() < 1e-5
    assert torch.equal(r.top_ids[-1], ref[0].topk(3).indices)


def test_logit_lens_statistics_against_a_plain_computation():
    model = tiny()
    x = ids(20, 1)[0]
    r = logit_lens(model, x, k=4)
    _, c = run_with_cache(model, x[None])
    final = F.log_softmax(model(x[None])[0][0], -1)
    for layer in range(model.n_layers + 1):
        h = c["embed"][0] if layer == 0 else c[f"blocks.{layer - 1}.resid_post"][0]
        logp = F.log_softmax(model.lm_head(model.ln_f(h)), -1)
        kl = F.kl_div(logp, final, log_target=True, reduction="none").sum(-1)
        torch.testing.assert_close(r.kl[layer], kl, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(r.entropy[layer], -(logp.exp() * logp).sum(-1), atol=1e-5, rtol=1e-4)
        p_next = logp[:-1].exp().gather(-1, x[1:, None])[:, 0]
        torch.testing.assert_close(r.next_prob[layer], p_next, atol=1e-6, rtol=1e-4)
        order = logp[:-1].argsort(-1, descending=True)
        rank = (order == x[1:, None]).float().argmax(-1)
        assert torch.equal(r.next_rank[layer], rank)
        torch.testing.assert_close(r.top_probs[layer], logp.exp().topk(4).values, atol=1e-6, rtol=1e-4)


def test_logit_lens_agrees_with_transformers_hidden_states():
    hf, model = hf_pair("llama-gqa")
    x = ids(20, 1)
    with torch.no_grad():
        hs = hf(x, output_hidden_states=True).hidden_states
        # HF's last hidden state is already final-normed; the others are not
        ref = [hf.lm_head(hf.model.norm(h)) for h in hs[:-1]] + [hf.lm_head(hs[-1])]
    r = logit_lens(model, x[0], k=3)
    for layer, z in enumerate(ref):
        torch.testing.assert_close(r.top_probs[layer], z[0].softmax(-1).topk(3).values, atol=1e-5, rtol=1e-4)


def test_lens_bad_input():
    model = tiny()
    with pytest.raises(ValueError, match="exceeds the model's context"):
        logit_lens(model, torch.zeros(65, dtype=torch.long))
    with pytest.raises(ValueError, match="empty prompt"):
        logit_lens(model, [])


# --- the tuned lens ----------------------------------------------------------------------------------

def peaked(seed=0):
    """A random model with large weights, so that each layer changes the prediction a lot."""
    torch.manual_seed(seed)
    model = GPT(ModelConfig(vocab_size=64, context=32, d_model=32, n_layers=3, n_heads=4, d_ff=64, name="peaked"))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(6.0)
    return model.eval()


def test_untrained_tuned_lens_is_the_logit_lens_and_saves_with_its_model(tmp_path):
    model = peaked()
    x = ids(16, 1, vocab=64)
    _, hs = streams(model, x)
    tuned, logit = TunedLens(model), LogitLens(model)
    for layer in range(model.n_layers + 1):
        assert torch.equal(tuned(hs[layer], layer), logit(hs[layer], layer))
    with torch.no_grad():
        for t in tuned.translators:
            t.lin.weight.normal_(0, 0.1)
            t.scale.uniform_(0.5, 2.0)
    path = tuned.save(tmp_path / "lens.safetensors")
    back = TunedLens.load(path, model)
    for layer in range(model.n_layers + 1):
        assert torch.equal(back(hs[layer], layer), tuned(hs[layer], layer))
    with pytest.raises(ValueError, match="trained for another model"):
        TunedLens.load(path, peaked(seed=1))
    with pytest.raises(FileNotFoundError, match="tuned-lens train"):
        TunedLens.load(tmp_path / "missing.safetensors", model)
    (tmp_path / "junk.safetensors").write_bytes(b"not a lens")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        TunedLens.load(tmp_path / "junk.safetensors", model)


def test_trained_tuned_lens_beats_the_logit_lens_below_the_last_layer():
    model = peaked()
    g = torch.Generator().manual_seed(3)
    train = torch.randint(0, 64, (40, 8, 24), generator=g)
    held = torch.randint(0, 64, (2, 8, 24), generator=g)
    params = {n: p.clone() for n, p in model.named_parameters()}
    lens = train_tuned_lens(model, iter(train), 40, lr=5e-3)
    assert all(torch.equal(p, params[n]) and p.requires_grad for n, p in model.named_parameters())
    logit, tuned = evaluate_lens(model, LogitLens(model), held), evaluate_lens(model, lens, held)
    for layer in range(model.n_layers):
        assert tuned["kl"][layer] < logit["kl"][layer], (layer, tuned["kl"], logit["kl"])
    assert tuned["kl"][-1] == pytest.approx(logit["kl"][-1]) and logit["kl"][-1] < 1e-5
    assert tuned["perplexity"][-1] == pytest.approx(logit["perplexity"][-1])


# --- deleting a layer -------------------------------------------------------------------------------

def test_deletion_table_against_the_manual_forward():
    model = tiny()
    x = ids(16, 3)
    table = deletion_table(model, x)
    base = F.cross_entropy(manual_forward(model, x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
    assert table["baseline"] == pytest.approx(float(base), abs=1e-5)
    for row in table["rows"]:
        k = row["block"]
        want = F.cross_entropy(manual_forward(model, x[:, :-1], skip={k}).flatten(0, 1), x[:, 1:].flatten())
        assert row["loss"] == pytest.approx(float(want), abs=1e-5)
        assert row["delta"] == pytest.approx(row["loss"] - table["baseline"])
    with pytest.raises(ValueError, match="out of range"):
        deletion_table(model, x, [5])


# --- neurons -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [{}, {"mlp": "swiglu", "norm": "rmsnorm", "positions": "rope"}])
def test_neuron_values_and_top_activations(kw):
    model = tiny(**kw)
    down = model.blocks[1].mlp.down
    v = down.weight[:, 5]  # unit 5's value vector
    if not kw:  # LayerNorm centres the stream before its gain
        v = v - v.mean()
    torch.testing.assert_close(value_logits(model, 1, 5), model.lm_head.weight @ (model.ln_f.g * v))
    x = ids(16, 5)
    values, positions = top_activations(model, x, layer=1, k=4, batch=2)
    _, c = run_with_cache(model, x, ["blocks.1.mlp_hidden"])
    acts = c["blocks.1.mlp_hidden"].flatten(0, 1)                     # (positions, units): brute force
    torch.testing.assert_close(values, acts.topk(4, dim=0).values.T)
    torch.testing.assert_close(acts.gather(0, positions.T).T, values)  # the positions hold those values
    with pytest.raises(ValueError, match="unit 999 is out of range"):
        value_logits(model, 1, 999)


# --- attention heads --------------------------------------------------------------------------------

def test_head_scores_of_uniform_attention():
    """With zero queries every head attends uniformly: query t puts 1 / (t + 1) on each key."""
    model = tiny()
    with torch.no_grad():
        for b in model.blocks:
            b.attn.q.weight.zero_()
            b.attn.q.bias.zero_()
    text = ids(12, 2)
    s = positional_scores(model, text)
    uniform = torch.tensor([1 / (t + 1) for t in range(2, 12)]).mean()
    torch.testing.assert_close(s["previous_token"], uniform.expand(3, 4))
    torch.testing.assert_close(s["first_token"], uniform.expand(3, 4))
    half = 8
    ind = induction_scores(model, n=2, half=half)
    torch.testing.assert_close(ind, torch.tensor([1 / (t + 1) for t in range(half, 2 * half)]).mean().expand(3, 4))


def test_head_scores_match_transformers_attention():
    hf, model = hf_pair("gpt2")
    text = ids(16, 2)
    scores = head_scores(model, text, n_random=2, half=8, seed=5)
    with torch.no_grad():
        att = torch.stack(hf(text, output_attentions=True).attentions)  # (L, B, H, T, T)
        rnd = torch.randint(0, V, (2, 8), generator=torch.Generator().manual_seed(5))
        att_r = torch.stack(hf(torch.cat([rnd, rnd], 1), output_attentions=True).attentions)
    prev = torch.stack([att[..., t, t - 1] for t in range(2, 16)], -1).mean((1, 3))
    first = torch.stack([att[..., t, 0] for t in range(2, 16)], -1).mean((1, 3))
    ind = torch.stack([att_r[..., t, t - 8 + 1] for t in range(8, 16)], -1).mean((1, 3))
    torch.testing.assert_close(scores["previous_token"], prev, atol=1e-6, rtol=0)
    torch.testing.assert_close(scores["first_token"], first, atol=1e-6, rtol=0)
    torch.testing.assert_close(scores["induction"], ind, atol=1e-6, rtol=0)
