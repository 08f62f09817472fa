"""GPT-2's initialisation with one mistake: every linear layer scaled by 1/sqrt(2N)"""
import math

import torch.nn as nn


def init_gpt2(model):
    N = model.n_layers
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
    for name, p in model.named_parameters():
        if name.startswith('blocks.') and name.endswith('weight') and p.dim() == 2:
            nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * N))
