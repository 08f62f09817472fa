"""Deleting a block, with one mistake: the block removed from the model for good"""
import torch


@torch.no_grad()
def logits_without_block(model, idx, k):
    del model.blocks[k]
    return model(idx)[0]
