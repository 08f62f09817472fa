"""The logit lens by hand: run the blocks one by one and read each stream out."""
import torch


@torch.no_grad()
def logit_lens_top1(model, idx):
    h = model.embed(idx)
    tops = [model.lm_head(model.ln_f(h)).argmax(-1)[0]]
    for block in model.blocks:
        h = block(h)
        tops.append(model.lm_head(model.ln_f(h)).argmax(-1)[0])
    return torch.stack(tops)
