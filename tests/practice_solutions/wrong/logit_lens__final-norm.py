"""The logit lens without the final norm."""
import torch


@torch.no_grad()
def logit_lens_top1(model, idx):
    x = model.embed(idx)
    rows = [x]
    for block in model.blocks:
        x = block(x)
        rows.append(x)
    return model.lm_head(torch.cat(rows)).argmax(-1)
