"""GPT-2's initialisation with one mistake: every parameter drawn, the norms' gains and biases too."""
import math

import torch.nn as nn


def init_gpt2(model):
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            nn.init.zeros_(p)
        else:
            nn.init.normal_(p, 0.0, 0.02)
    for block in model.blocks:
        for lin in (block.attn.out, block.mlp.proj):
            nn.init.normal_(lin.weight, 0.0, 0.02 / math.sqrt(2 * model.n_layers))
