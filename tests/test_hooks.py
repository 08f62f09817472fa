"""run_with_hooks, the one hook mechanism: against editing the weights by hand, against replace_activation and
the older hooks(), against the attention and norm formulas recomputed from the weights (q, k, v, scores, z,
the norms' scales, the MLP's pre-activation), and gradients against autograd on a forward pass written out."""

import pytest
import torch

from helpers.presets import tiny_preset
from lumen.errors import UserError
from lumen.inspect import (
    UnknownActivation,
    activation_names,
    head_weights,
    hooks,
    replace_activation,
    run_with_cache,
    run_with_hooks,
)
from lumen.inspect.readout import norm_scale

FAMILIES = ["gpt2", "baby-llama", "pythia-70m", "gemma-2b"]


def ids(T=9, B=2, seed=1):
    return torch.randint(0, 97, (B, T), generator=torch.Generator().manual_seed(seed))


def no_hooks_left(model):
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("name", FAMILIES)
def test_zeroing_a_heads_output_by_a_hook_is_zeroing_its_columns_of_attn_out(name):
    model, x = tiny_preset(name), ids()
    h, layer = 2, 1

    def knock_out(z, site):
        assert site == f"blocks.{layer}.z" and z.shape[2:] == (4, model.cfg.head_dim)
        z = z.clone()
        z[:, :, h] = 0
        return z

    with torch.no_grad():
        hooked = run_with_hooks(model, x, fwd_hooks=[(f"blocks.{layer}.z", knock_out)])
        assert no_hooks_left(model)
        out = model.attention(layer).out
        hd = model.cfg.head_dim
        saved = out.weight[:, h * hd:(h + 1) * hd].clone()
        out.weight[:, h * hd:(h + 1) * hd] = 0          # the same head removed by editing W_O
        by_hand, _ = model(x)
        out.weight[:, h * hd:(h + 1) * hd] = saved
        plain, _ = model(x)
    torch.testing.assert_close(hooked, by_hand, atol=1e-6, rtol=0)
    assert not torch.allclose(hooked, plain, atol=1e-4)


def test_zeroing_a_value_head_by_a_hook_is_zeroing_its_rows_of_w_v():
    model, x = tiny_preset("baby-llama"), ids()          # GQA: 2 KV heads for 4 query heads
    v_head = 1

    def zero(v, site):
        assert v.shape[2] == 2
        v = v.clone()
        v[:, :, v_head] = 0
        return v

    with torch.no_grad():
        hooked = run_with_hooks(model, x, fwd_hooks=[("blocks.0.v", zero)])
        lin, hd = model.attention(0).v, model.cfg.head_dim
        saved = lin.weight.clone()
        lin.weight[v_head * hd:(v_head + 1) * hd] = 0
        by_hand, _ = model(x)
        lin.weight.copy_(saved)
    torch.testing.assert_close(hooked, by_hand, atol=1e-6, rtol=0)


def test_hooks_agree_with_replace_activation_and_the_old_form():
    model, x = tiny_preset("gpt2"), ids()
    with torch.no_grad():
        with replace_activation(model, "blocks.1.mlp_out", lambda a: 0.5 * a):
            want, _ = model(x)
        with hooks(model, {"blocks.1.mlp_out": lambda a: 0.5 * a}):
            old, _ = model(x)
        got = run_with_hooks(model, x, fwd_hooks=[("blocks.1.mlp_out", lambda a, n: 0.5 * a)])
    assert torch.equal(got, want) and torch.equal(old, want) and no_hooks_left(model)


def test_several_hooks_per_site_run_in_order_and_predicates_pick_sites():
    model, x = tiny_preset("baby-llama"), ids()
    seen = []
    with torch.no_grad():
        got = run_with_hooks(model, x, fwd_hooks=[
            ("blocks.0.attn_out", lambda a, n: a + 1.0),
            ("blocks.0.attn_out", lambda a, n: 2 * a),                      # sees the first one's result
            (lambda n: n.endswith("resid_post"), lambda a, n: seen.append(n)),
        ])
        with replace_activation(model, "blocks.0.attn_out", lambda a: 2 * (a + 1.0)):
            want, _ = model(x)
    assert torch.equal(got, want)
    assert seen == ["blocks.0.resid_post", "blocks.1.resid_post"]
    every = activation_names(model, every=True)
    assert every.index("blocks.0.q") < every.index("blocks.0.attn_scores") < every.index("blocks.0.z") \
        < every.index("blocks.0.mlp_pre") < every.index("blocks.0.resid_post") < every.index("final")


@pytest.mark.parametrize("name", FAMILIES)
def test_the_fine_sites_are_the_formulas_on_the_weights(name):
    model, x = tiny_preset(name), ids()
    _, c = run_with_cache(model, x, activation_names(model, every=True))
    for i, b in enumerate(model.blocks):
        w = head_weights(model, i)
        a = c[f"blocks.{i}.resid_pre"]
        h = b.ln1(a)
        torch.testing.assert_close(c[f"blocks.{i}.ln1_scale"], norm_scale(b.ln1, a))
        for kind, W, bias in (("q", w.W_Q, w.b_Q), ("k", w.W_K, w.b_K), ("v", w.W_V, w.b_V)):
            got = c[f"blocks.{i}.{kind}"]                                   # (B, T, heads or KV heads, hd)
            if kind != "q":                                                  # per query head, for the check
                got = got.repeat_interleave(w.group, 2)
            want = torch.einsum("btd,hdk->bthk", h, W) + (bias if bias is not None else 0)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        scores, pattern = c[f"blocks.{i}.attn_scores"], c[f"blocks.{i}.attn_pattern"]
        T = x.size(1)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        if model.cfg.sliding_window:
            causal &= ~torch.ones(T, T, dtype=torch.bool).tril(-model.cfg.sliding_window)
        torch.testing.assert_close(scores.masked_fill(~causal, float("-inf")).softmax(-1), pattern, atol=1e-6, rtol=0)
        v = c[f"blocks.{i}.v"].repeat_interleave(w.group, 2)                # (B, T, H, hd)
        z = torch.einsum("bhts,bshk->bthk", pattern, v)
        torch.testing.assert_close(c[f"blocks.{i}.z"], z, atol=1e-5, rtol=0)
        torch.testing.assert_close(c[f"blocks.{i}.z"].flatten(-2), c[f"blocks.{i}.attn_heads"])
        out = torch.einsum("bthk,hkd->btd", z, w.W_O) + (w.b_O if w.b_O is not None else 0)
        torch.testing.assert_close(c[f"blocks.{i}.attn_out"], out, atol=1e-5, rtol=0)
        mlp = b.mlp
        first = mlp.w_gate if hasattr(mlp, "w_gate") else mlp.fc
        stream_in = a if name == "pythia-70m" else c[f"blocks.{i}.resid_mid"]   # (parallel: both read resid_pre)
        torch.testing.assert_close(c[f"blocks.{i}.ln2_scale"], norm_scale(b.ln2, stream_in))
        torch.testing.assert_close(c[f"blocks.{i}.mlp_pre"], first(b.ln2(stream_in)), atol=1e-6, rtol=0)
    last = c[f"blocks.{len(model.blocks) - 1}.resid_post"]
    torch.testing.assert_close(c["final_scale"], norm_scale(model.ln_f, last))


def test_replacing_a_norms_scale():
    """The scale itself given back changes nothing, bit for bit; twice the scale halves the normed stream
    (less the bias), which we recompute by hand."""
    model, x = tiny_preset("gpt2"), ids()
    with torch.no_grad():
        plain, _ = model(x)
        same = run_with_hooks(model, x, fwd_hooks=[("blocks.1.ln2_scale", lambda s, n: s.clone())])
        doubled = run_with_hooks(model, x, fwd_hooks=[("final_scale", lambda s, n: 2 * s)])
        _, c = run_with_cache(model, x, ["blocks.1.resid_post"])
        h, ln = c["blocks.1.resid_post"], model.ln_f
        s = torch.sqrt(h.var(-1, keepdim=True, unbiased=False) + ln.eps)
        want = model.lm_head((h - h.mean(-1, keepdim=True)) / (2 * s) * ln.g + ln.b)
    assert torch.equal(same, plain)
    torch.testing.assert_close(doubled, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["gpt2", "baby-llama"])
def test_backward_hooks_see_the_gradient_autograd_gives(name):
    model, x = tiny_preset(name), ids(B=1)
    grads = {}

    def keep(g, n):
        grads[n] = g.clone()

    logits = run_with_hooks(model, x, bwd_hooks=[("blocks.1.resid_pre", keep), ("blocks.0.z", keep)])
    (logits[0, -1, 5] - logits[0, -1, 9]).backward()
    assert no_hooks_left(model)
    # the same gradients by hand: the forward pass written out from the stream entering block 1
    _, c = run_with_cache(model, x, ["blocks.1.resid_pre", "blocks.0.z"])
    h = c["blocks.1.resid_pre"].clone().requires_grad_(True)
    z = model.blocks[1](h)
    out = model.lm_head(model.ln_f(z))
    (g,) = torch.autograd.grad(out[0, -1, 5] - out[0, -1, 9], h)
    torch.testing.assert_close(grads["blocks.1.resid_pre"], g, atol=1e-6, rtol=0)
    assert grads["blocks.0.z"].shape == c["blocks.0.z"].shape
    # a backward hook may replace the gradient: zeroed at block 1's input, nothing reaches block 0
    model.zero_grad()
    got = {}
    logits = run_with_hooks(model, x, bwd_hooks=[("blocks.1.resid_pre", lambda g, n: torch.zeros_like(g)),
                                                 ("blocks.0.z", lambda g, n: got.setdefault(n, g.clone()))])
    (logits[0, -1, 5] - logits[0, -1, 9]).backward()
    assert float(got["blocks.0.z"].abs().max()) == 0.0


def test_hook_errors_are_clear():
    model, x = tiny_preset("gpt2"), ids()
    with pytest.raises(UnknownActivation, match="did you mean 'blocks.0.attn_scores'"):
        run_with_hooks(model, x, fwd_hooks=[("blocks.0.attn_score", lambda a, n: None)])
    with pytest.raises(UserError, match="must return None or a tensor"):
        run_with_hooks(model, x, fwd_hooks=[("blocks.0.q", lambda a, n: a.flatten(-2))])
    with pytest.raises(UserError, match="cannot be replaced"):
        run_with_hooks(model, x, fwd_hooks=[("blocks.0.resid_mid", lambda a, n: a * 2)])
    with pytest.raises(UserError, match="out of range"):
        run_with_hooks(model, x, fwd_hooks=[("blocks.7.q", lambda a, n: None)])
    assert no_hooks_left(model)
    with torch.no_grad():   # reading hooks alone (no pattern or score) leave the fused path and its numbers alone
        plain, _ = model(x)
        reading = (lambda n: not n.endswith(("pattern", "scores")), lambda a, n: None)
        read = run_with_hooks(model, x, fwd_hooks=[reading])
    assert torch.equal(read, plain)


def test_a_pre_ln_resid_mid_gradient_is_refused_with_the_way_to_get_it():
    model, x = tiny_preset("gpt2"), ids()
    with pytest.raises(UserError, match="attn_out"):
        run_with_hooks(model, x, bwd_hooks=[("blocks.0.resid_mid", lambda g, n: None)])
