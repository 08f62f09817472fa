"""The logit lens for every layer of a 512-token prompt on SmolLM2-135M: lumen against the same lens
computed through Hugging Face transformers' `output_hidden_states`.

    .venv/bin/python bench/bench_lens.py [--tokens 512] [--repeats 2] [--top-k 5]

lumen: one forward pass with hooks on the residual stream, then the final norm and unembedding of many
layers batched into one matmul, reduced on the fly to top-k, next-token probability and rank, entropy
and KL to the final output. HF: one forward with output_hidden_states=True, then the model's norm and
lm_head layer by layer (its last hidden state is already normed), reduced the same way. Both compute the
same numbers (checked here); the time is the median of --repeats runs. The machine may be shared: run
it twice. Not a test.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from common import timed  # bench/common.py (the script's own folder is on sys.path)


@torch.no_grad()
def hf_lens(hf, idx: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
    """The logit lens through transformers: hidden states, then norm + lm_head for each layer."""
    hs = hf(idx, output_hidden_states=True).hidden_states
    final = F.log_softmax(hf.lm_head(hs[-1])[0], -1)
    tops, kls = [], []
    for i, h in enumerate(hs):
        z = hf.lm_head(h if i == len(hs) - 1 else hf.model.norm(h))[0]
        logp = F.log_softmax(z, -1)
        tops.append(logp.exp().topk(k, dim=-1))
        kls.append(F.kl_div(logp, final, log_target=True, reduction="none").sum(-1))
        _ = logp[:-1].gather(-1, idx[0, 1:, None])             # next-token probability
        _ = (logp[:-1] > _).sum(-1)                            # and rank
        _ = -(logp.exp() * logp).sum(-1)                       # entropy
    return {"top_probs": torch.stack([t.values for t in tops]), "top_ids": torch.stack([t.indices for t in tops]),
            "kl": torch.stack(kls)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--top-k", type=int, default=5)
    args = ap.parse_args()

    import transformers

    from lumen.fetch import fetch
    from lumen.formats import load
    from lumen.inspect.corpus import token_windows
    from lumen.inspect.lens import logit_lens

    transformers.utils.logging.set_verbosity_error()
    loaded = load("smollm2")
    model, tok = loaded.model, loaded.tokenizer
    path = fetch("smollm2", quiet=True)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    hf.eval()
    idx = token_windows(tok, "shakespeare", "val", 1, args.tokens, seed=0)

    t_lumen, ours = timed(lambda: logit_lens(model, idx[0], k=args.top_k), args.repeats)
    t_hf, ref = timed(lambda: hf_lens(hf, idx, args.top_k), args.repeats)
    t_fwd, _ = timed(lambda: model(idx), args.repeats)
    diff_p = float((ours.top_probs - ref["top_probs"]).abs().max())
    same_top1 = float((ours.top_ids[..., 0] == ref["top_ids"][..., 0]).float().mean())
    diff_kl = float(((ours.kl - ref["kl"]).abs() / (1 + ref["kl"].abs())).max())
    L = model.n_layers + 1
    print(f"SmolLM2-135M, logit lens over {L} layers x {args.tokens} tokens, {torch.get_num_threads()} threads")
    print(f"  lumen  (hooks + batched unembedding)   {t_lumen:8.2f} s")
    print(f"  HF     (output_hidden_states + loop)   {t_hf:8.2f} s   lumen is {t_hf / t_lumen:.2f}x faster")
    print(f"  (one plain lumen forward pass:         {t_fwd:8.2f} s)")
    print(f"agreement: max |top-k prob diff| {diff_p:.1e}, same top-1 in {same_top1:.1%} of cells, "
          f"max relative KL diff {diff_kl:.1e}")


if __name__ == "__main__":
    main()
