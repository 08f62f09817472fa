"""The full model: loss, tying, decoding, and clear errors for inputs it cannot read."""

import pytest
import torch
import torch.nn.functional as F

from lumen import GPT, PRESETS, ModelConfig, fast
from lumen.attention import KVCache
from lumen.decode import Sampling, sample_next

TINY = ModelConfig(vocab_size=50, context=16, d_model=32, n_layers=2, n_heads=4)


def test_loss_is_cross_entropy_of_logits():
    torch.manual_seed(0)
    model = GPT(TINY)
    idx, targets = torch.randint(0, 50, (2, 10)), torch.randint(0, 50, (2, 10))
    targets[0, :3] = -1  # ignored positions
    logits, loss = model(idx, targets)
    keep = targets.flatten() != -1
    ref = F.cross_entropy(logits.flatten(0, 1)[keep], targets.flatten()[keep])
    torch.testing.assert_close(loss, ref)
    # at init every token is about equally likely: loss ~ ln(vocab)
    assert loss.item() == pytest.approx(torch.log(torch.tensor(50.0)).item(), rel=0.05)


def test_tied_and_untied_output_projection():
    tied = GPT(TINY)
    assert tied.lm_head.weight.data_ptr() == tied.tok_emb.weight.data_ptr()
    untied = GPT(TINY.replace(tie_embeddings=False))
    assert untied.lm_head.weight.data_ptr() != untied.tok_emb.weight.data_ptr()
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(untied) - n(tied) == 50 * 32


@pytest.mark.parametrize("cap", [None, 30.0])
def test_last_only_is_the_last_positions_logits(cap):
    """Decoding reads one position of a prompt: unembedding that one alone gives its numbers (each position is
    normed and unembedded on its own), with a cache too, and the cache is filled as for every position."""
    torch.manual_seed(0)
    model = GPT(TINY.replace(positions="rope", context=32, final_softcap=cap)).eval()
    idx = torch.randint(0, 50, (2, 9))
    full, _ = model(idx)
    last, _ = model(idx, last_only=True)
    assert last.shape == (2, 1, 50)
    torch.testing.assert_close(last, full[:, -1:], rtol=1e-5, atol=1e-6)
    caches = [KVCache(model.cfg, 2, 16, "cpu", torch.float32) for _ in range(2)]
    model(idx, cache=caches[0])
    model(idx, cache=caches[1], last_only=True)
    for a, b in zip(caches[0].layers, caches[1].layers):
        assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
    with pytest.raises(ValueError, match="targets or last_only"):
        model(idx, idx, last_only=True)


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_cached_decode_equals_uncached(positions):
    torch.manual_seed(0)
    model = GPT(TINY.replace(positions=positions, context=32)).eval()
    idx = torch.randint(0, 50, (2, 5))
    fast = model.generate(idx, 12, temperature=0)
    slow = model.generate(idx, 12, temperature=0, use_cache=False)
    assert torch.equal(fast, slow)


def test_cached_decode_under_bf16_autocast():
    """Keys computed in bf16 under autocast go into a float32 cache (how training samples its text):
    the cached logits are the uncached forward's, to bf16 rounding."""
    torch.manual_seed(0)
    model = GPT(TINY.replace(positions="rope", context=32)).eval()
    idx = torch.randint(0, 50, (1, 9))
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        full = model(idx)[0].float()
        cache = KVCache(model.cfg, 1, 32)
        steps = [model(idx[:, :5], cache=cache)[0]] + [model(idx[:, t:t + 1], cache=cache)[0] for t in range(5, 9)]
        assert len(model.generate(idx[:, :5], 6, temperature=0)[0]) == 11
    torch.testing.assert_close(torch.cat(steps, 1).float(), full, rtol=0, atol=0.05)
    assert cache.layers[0].k.dtype == torch.float32 and cache.n == 9


@pytest.mark.smoke  # (compiled decoding's one test in make test)
def test_compiled_decoding_step_gives_the_eager_numbers(cpp_compiler):
    # torch.compile'd one-token steps (static cache shapes, the weights graph inputs) against eager decoding
    torch.manual_seed(0)
    model = GPT(TINY.replace(positions="rope", n_kv_heads=2, context=300)).eval()
    idx = torch.randint(0, 50, (2, 5))
    eager = model.generate(idx, 10, temperature=0)
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    with fast.decoding(model, compile=True) as decoder:
        assert torch.equal(decoder.generate(idx, 10, temperature=0), eager)
        with torch.inference_mode():  # a whole sequence (a prefill) through the same compiled step
            torch.testing.assert_close(decoder.step(idx)[0], model(idx)[0], rtol=1e-5, atol=1e-5)
        # a different length and sampling reuse the same compiled step (slots are rounded up to 256)
        sampled = decoder.generate(idx[:, :3], 7, temperature=1.0, top_k=5, generator=g())
    assert torch.equal(sampled, model.generate(idx[:, :3], 7, temperature=1.0, top_k=5, generator=g()))
    # the weights are inputs of the compiled graph: changing them changes what it computes
    with torch.no_grad():
        model.lm_head.weight.mul_(-1)
    flipped = model.generate(idx, 10, temperature=0)
    assert torch.equal(fast.generate(model, idx, 10, temperature=0, compile=True), flipped)


def test_sampling_is_seeded_and_respects_top_k_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]])
    g = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    top2 = Sampling(1.0, top_p=None, top_k=2)
    draws = [sample_next(logits, top2, generator=g()) for _ in range(3)]
    assert all(torch.equal(d, draws[0]) for d in draws)
    many = torch.stack([sample_next(logits.expand(500, 5), top2, generator=g())])
    assert set(many.unique().tolist()) <= {0, 1}
    # top_p = 0.5: token 0 alone holds softmax mass ~0.61, so it is the only one kept
    assert set(sample_next(logits.expand(200, 5), Sampling(1.0, top_p=0.5), generator=g()).tolist()) == {0}
    assert sample_next(logits, Sampling(0.0)).item() == 0  # temperature 0 is greedy


def test_bad_inputs_raise_clear_errors():
    model = GPT(TINY)
    with pytest.raises(ValueError, match="exceeds the model's context of 16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 50\)"):
        model(torch.full((1, 4), 50))
    with pytest.raises(TypeError, match="integer tensor"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="shape"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="context"):  # a prompt the model cannot read (decoding past it slides)
        model.generate(torch.zeros(1, 17, dtype=torch.long), 1)


def test_invalid_configs_name_the_field():
    cases = [
        (dict(d_model=30, n_heads=4), "d_model"),
        (dict(n_heads=6, n_kv_heads=4, d_model=48), "n_kv_heads"),
        (dict(n_layers=0), "n_layers"),
        (dict(activation="tanh"), "activation"),
        (dict(norm="batchnorm"), "norm"),
        (dict(d_ff=-1), "d_ff"),
    ]
    for kw, field in cases:
        with pytest.raises(ValueError, match=field):
            ModelConfig(**kw)
    with pytest.raises(ValueError, match="unknown preset"):
        ModelConfig.from_name("gpt5")
    with pytest.raises(ValueError, match="unknown ModelConfig field"):
        ModelConfig().replace(widht=3)


@pytest.mark.parametrize("name", [n for n in PRESETS if n != "llama3-70b"])
def test_every_buildable_preset_runs(name):
    """Each preset builds and runs a forward and a backward pass at its width (one layer, a small vocabulary
    and, for a mixture, twice as many experts as a token takes, to stay fast: 128 of Qwen3-30B-A3B's took ten
    seconds to initialize; the full shapes are counted in test_accounting)."""
    cfg = ModelConfig.from_name(name)
    cfg = cfg.replace(n_layers=1, vocab_size=512, **({"n_experts": 2 * cfg.experts_per_token} if cfg.n_experts else {}))
    model = GPT(cfg)
    idx = torch.randint(0, cfg.vocab_size, (1, 8))
    logits, loss = model(idx, idx)
    loss.backward()
    assert logits.shape == (1, 8, cfg.vocab_size)
    # (a mixture of experts: only the experts the router picked for these 8 tokens take part, at least top_k)
    assert all(p.grad is not None for n, p in model.named_parameters() if ".experts." not in n)
    used = {n.split(".experts.")[1].split(".")[0] for n, p in model.named_parameters()
            if ".experts." in n and p.grad is not None}
    assert len(used) >= cfg.experts_per_token if cfg.n_experts else not used


def test_from_state_equals_the_model_it_was_taken_from():
    """Every format loads through GPT.from_state: the result must compute what the original computes."""
    for preset in ("baby-gpt", "baby-llama"):
        torch.manual_seed(0)
        model = GPT.from_preset(preset).eval()
        state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight" or not model.cfg.tie_embeddings}
        loaded = GPT.from_state(model.cfg, state)
        ids = torch.randint(0, model.cfg.vocab_size, (2, 9))
        torch.testing.assert_close(loaded(ids)[0], model(ids)[0], rtol=0, atol=0)
        assert (loaded.lm_head.weight is loaded.tok_emb.weight) == model.cfg.tie_embeddings


@pytest.mark.parametrize("damage", ["missing", "extra", "shape", "int", "nan", "layers"])
def test_from_state_refuses_weights_that_do_not_fit(damage):
    from lumen.errors import ModelFileError

    model = GPT.from_preset("baby-llama")
    state, cfg = dict(model.state_dict()), model.cfg
    name = "blocks.0.attn.q.weight"
    if damage == "missing":
        del state[name]
    elif damage == "extra":
        state["blocks.0.attn.q.bias"] = torch.zeros(cfg.d_model)
    elif damage == "shape":
        state[name] = state[name][:, :-1]
    elif damage == "int":
        state[name] = state[name].to(torch.int32)
    elif damage == "nan":
        state[name] = state[name].clone()
        state[name][0, 0] = float("nan")
    else:
        cfg = cfg.replace(n_layers=cfg.n_layers + 1)
    with pytest.raises(ModelFileError, match="some/file"):
        GPT.from_state(cfg, state, source="some/file")



@pytest.mark.parametrize("preset", ["baby-llama", "baby-gpt"])
def test_a_template_has_the_models_shapes(preset):
    """GPT.template: every tensor of a built model (parameters, and RoPE's tables that a template does not
    compute), same name, shape and dtype, on the meta device."""
    cfg = GPT.from_preset(preset).cfg
    built, template = GPT(cfg), GPT.template(cfg)

    def shapes(m: GPT) -> dict:
        return {n: (t.shape, t.dtype) for n, t in [*m.named_parameters(), *m.named_buffers()]}

    assert shapes(template) == shapes(built)
    assert all(t.is_meta for t in [*template.parameters(), *template.buffers()])
