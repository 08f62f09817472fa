"""Deleting a block, with one mistake: only the MLP's write removed"""
import torch


@torch.no_grad()
def logits_without_block(model, idx, k):
    x = model.embed(idx)
    for i, block in enumerate(model.blocks):
        if i == k:
            x = x + block.drop(block.attn(block.ln1(x)))
        else:
            x = block(x)
    return model.lm_head(model.ln_f(x))
