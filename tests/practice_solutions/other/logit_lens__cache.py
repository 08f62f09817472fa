"""The logit lens from lumen's activation cache, the final norm and unembedding applied by hand."""
import torch

from lumen.inspect import run_with_cache


def logit_lens_top1(model, idx):
    names = ["embed"] + [f"blocks.{i}.resid_post" for i in range(len(model.blocks))]
    _, cache = run_with_cache(model, idx, names)
    with torch.no_grad():
        streams = torch.cat([cache[n] for n in names])          # (layers, T, d)
        return (model.ln_f(streams) @ model.lm_head.weight.T).argmax(dim=-1)
