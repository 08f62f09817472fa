import torch

from lumen.inspect import delete_blocks


@torch.no_grad()
def logits_without_block(model, idx, k):
    with delete_blocks(model, k):
        return model(idx)[0]
