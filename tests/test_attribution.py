"""Direct logit attribution: the contributions add up to the logit the model's own forward pass gives
(Hugging Face's for random GPT-2 and Llama models, lumen's for its own presets and the real SmolLM2), and
each head's share is what its columns of attn.out write, read through the frozen final norm."""

import pytest
import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from lumen import GPT, ModelConfig
from lumen.errors import UserError
from lumen.formats.hf import from_hf_model
from lumen.inspect import run_with_cache
from lumen.inspect.attribution import attribute, top_components
from lumen.tokenizers import single_token

V = 97
HF = {
    "gpt2": lambda: GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=64, n_embd=48, n_layer=3, n_head=4)),
    "llama-gqa": lambda: LlamaForCausalLM(LlamaConfig(
        vocab_size=V, hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)),
}


def ids(n=20, seed=1, vocab=V):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def hf_pair(name):
    torch.manual_seed(0)
    hf = HF[name]().eval()
    hf.config._attn_implementation = "eager"
    with torch.no_grad():  # HF inits biases and norm gains to 0/1: randomise them so that they matter
        for p in hf.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.3)
            else:
                p.mul_(4.0)   # larger writes: a norm scale far from 1 and logits of several units
    return hf, from_hf_model(hf).eval()


@pytest.mark.parametrize("name", HF)
def test_contributions_sum_to_transformers_logits(name):
    hf, model = hf_pair(name)
    x = ids()
    with torch.no_grad():
        ref = hf(x[None]).logits[0].double()
    a = attribute(model, x)
    assert a.values.shape == (len(a.components), len(x))
    want = ref[torch.arange(len(x)), a.target]
    torch.testing.assert_close(a.values.sum(0), want, atol=1e-4, rtol=0)
    assert float(want.abs().max()) > 1.0          # logits big enough for the check to mean something
    layernorm = name == "gpt2"
    assert ("ln_f.b" in a.components) == layernorm and ("pos_emb" in a.components) == layernorm
    # a contrast splits the difference of two logits
    c = attribute(model, x, contrast=(3, 5))
    torch.testing.assert_close(c.values.sum(0), ref[:, 3] - ref[:, 5], atol=1e-4, rtol=0)


@pytest.mark.parametrize("kw", [{}, {"mlp": "swiglu", "norm": "rmsnorm", "positions": "rope", "bias": False,
                                     "n_kv_heads": 2}])
def test_heads_and_bias_make_up_each_attention_write(kw):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=V, context=64, d_model=32, n_layers=3, n_heads=4, d_ff=64, name="t").replace(**kw)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    x = ids(16)
    a = attribute(model, x, target=7)
    logits, cache = run_with_cache(model, x[None], lambda n: not n.endswith(("pattern", "scores")))  # fused
    torch.testing.assert_close(a.logit, logits[0, :, 7].double(), atol=1e-6, rtol=0)
    torch.testing.assert_close(a.values.sum(0), a.logit, atol=1e-5, rtol=0)
    for i in range(cfg.n_layers):
        torch.testing.assert_close(a.heads[i].sum(0) + a.attn_bias[i], a.row(f"blocks.{i}.attn"), atol=1e-6, rtol=0)
    # head 2 of block 1, independently: its value-weighted sum through its own columns of W_O (a plain
    # linear map with every other head's output zeroed), then the final norm as a function of the final
    # stream with its scale held at the real one: its share is what removing that write changes
    L, b, h, hd = cfg.n_layers, model.blocks[1], 2, cfg.head_dim
    z = cache["blocks.1.attn_heads"][0].double()
    only = torch.zeros_like(z)
    only[:, h * hd:(h + 1) * hd] = z[:, h * hd:(h + 1) * hd]
    write = F.linear(only, b.attn.out.weight.double())                                  # (T, d)
    x_final = cache[f"blocks.{L - 1}.resid_post"][0].double()
    norm = model.ln_f

    def frozen(y):   # the final norm with the scale of x_final, for any stream y
        if cfg.norm == "layernorm":
            s = x_final.var(-1, unbiased=False, keepdim=True).add(norm.eps).sqrt()
            return (y - y.mean(-1, keepdim=True)) / s * norm.g.double() + norm.b.double()
        s = x_final.pow(2).mean(-1, keepdim=True).add(norm.eps).sqrt()
        return y / s * norm.g.double()

    W = model.lm_head.weight.double()
    torch.testing.assert_close(frozen(x_final) @ W[7], a.logit, atol=1e-5, rtol=0)
    direct = frozen(x_final) @ W[7] - frozen(x_final - write) @ W[7]
    torch.testing.assert_close(a.heads[1, h], direct, atol=1e-9, rtol=0)
    assert float(a.heads[1, h].abs().max()) > 1e-3


def test_top_components_and_errors():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=V, context=64, d_model=32, n_layers=2, n_heads=4, name="t")).eval()
    a = attribute(model, ids(8))
    top = top_components(a, n=200)
    # every write counted once: heads and biases instead of whole attention outputs
    assert sum(v for _, v in top) == pytest.approx(float(a.logit[-1]), abs=1e-5)
    assert [abs(v) for _, v in top] == sorted((abs(v) for _, v in top), reverse=True)
    with pytest.raises(UserError, match="eval mode"):
        attribute(model.train(), ids(8))
    post = GPT(ModelConfig(vocab_size=V, context=64, d_model=32, n_layers=2, n_heads=4, norm_placement="post"))
    with pytest.raises(UserError, match="pre-LN"):
        attribute(post.eval(), ids(8))


@torch.no_grad()
@pytest.mark.smoke  # (this feature's real-model test in make test)
def test_smollm2_paris_over_rome_sums_to_its_logit_difference(smollm2, smollm2_tokenizer):
    tok = smollm2_tokenizer
    prompt = tok.encode("The Eiffel Tower is in the city of")
    paris, rome = single_token(tok, " Paris", "--contrast"), single_token(tok, " Rome", "--contrast")
    a = attribute(smollm2, prompt, contrast=(paris, rome), tokenizer=tok)
    logits = smollm2(torch.tensor([prompt]))[0][0].double()
    torch.testing.assert_close(a.values.sum(0), logits[:, paris] - logits[:, rome], atol=1e-4, rtol=0)
    assert a.components[0] == "embed" and len(a.components) == 1 + 2 * smollm2.cfg.n_layers   # RMSNorm: no bias
    assert a.heads.shape == (30, 9, len(prompt))
    t = attribute(smollm2, prompt, tokenizer=tok)          # each position's own top-1 prediction
    torch.testing.assert_close(t.values.sum(0), logits.max(-1).values, atol=1e-4, rtol=0)
    with pytest.raises(UserError, match="not one"):
        single_token(tok, " Eiffel Tower", "--target")
