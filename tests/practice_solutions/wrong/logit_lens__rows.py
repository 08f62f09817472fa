"""The logit lens without the embedding's row."""
import torch


@torch.no_grad()
def logit_lens_top1(model, idx):
    x = model.embed(idx)
    rows = []
    for block in model.blocks:
        x = block(x)
        rows.append(x)
    return model.lm_head(model.ln_f(torch.cat(rows))).argmax(-1)
