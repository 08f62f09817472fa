"""The looking-inside tools on the real SmolLM2-135M, against Hugging Face transformers."""

import pytest
import torch

from lumen.inspect import LogitLens, head_scores, logit_lens
from lumen.inspect.heads import summarize
from lumen.inspect.lens import streams

PROMPT = "The capital of France is"


@torch.no_grad()
@pytest.mark.smoke  # (this feature's real-model test in make test)
def test_logit_lens_matches_transformers_hidden_states(smollm2, smollm2_hf, smollm2_tokenizer):
    ids = smollm2_tokenizer.encode(PROMPT)
    x = torch.tensor([ids])
    r = logit_lens(smollm2, ids, k=5, tokenizer=smollm2_tokenizer)
    hs = smollm2_hf(x, output_hidden_states=True).hidden_states
    assert len(hs) == r.n_layers + 1
    final = smollm2_hf.lm_head(hs[-1])[0].log_softmax(-1)
    for layer, h in enumerate(hs):
        # HF's last hidden state has already been through the final norm
        z = smollm2_hf.lm_head(h if layer == r.n_layers else smollm2_hf.model.norm(h))[0]
        logp = z.log_softmax(-1)
        torch.testing.assert_close(r.top_probs[layer], logp.exp().topk(5).values, atol=2e-4, rtol=1e-3)
        kl = (final.exp() * (final - logp)).sum(-1)
        torch.testing.assert_close(r.kl[layer], kl, atol=1e-3, rtol=5e-3)  # KLs of up to ~100 nats
    assert float(r.kl[-1].abs().max()) < 1e-4  # the lens at the last layer is the model's own output
    logits, hs = streams(smollm2, x)
    assert torch.equal(LogitLens(smollm2)(hs[-1], r.n_layers), smollm2(x)[0])  # exact at the last layer
    assert r.top_tokens(r.n_layers)[-1] == smollm2_tokenizer.decode([int(logits[0, -1].argmax())])


def test_smollm2_has_induction_and_previous_token_heads(smollm2, smollm2_tokenizer):
    """Every trained LM of a few layers grows induction heads; the scores must find them on random tokens
    (where attention by chance would give ~1/40 on the induction key)."""
    text = torch.tensor([smollm2_tokenizer.encode("Once upon a time there was a little fox who lived in a wood "
                                                  "near a river, and every morning she went down to drink.")])
    s = head_scores(smollm2, text, n_random=2, half=24)
    assert s["induction"].shape == (smollm2.cfg.n_layers, smollm2.cfg.n_heads)
    assert float(s["induction"].max()) > 0.3
    assert float(s["previous_token"].max()) > 0.5
    summary = summarize(s)
    assert summary["induction"]["heads_above"]  # where they sit is measured, not asserted
