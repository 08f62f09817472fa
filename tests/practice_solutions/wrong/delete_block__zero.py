"""Deleting a block, with one mistake: the stream zeroed instead of passed on"""
import torch


@torch.no_grad()
def logits_without_block(model, idx, k):
    x = model.embed(idx)
    for i, block in enumerate(model.blocks):
        x = torch.zeros_like(x) if i == k else block(x)
    return model.lm_head(model.ln_f(x))
