"""GPT-2's initialisation with one mistake: the embeddings forgotten."""
import math

import torch.nn as nn


def init_gpt2(model):
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    for block in model.blocks:
        for lin in (block.attn.out, block.mlp.proj):
            nn.init.normal_(lin.weight, 0.0, 0.02 / math.sqrt(2 * model.n_layers))
