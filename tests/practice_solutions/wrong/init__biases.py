"""GPT-2's initialisation with one mistake: the biases left as they were"""
import math

import torch.nn as nn


def init_gpt2(model):
    N = model.n_layers
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            pass
    for name, p in model.named_parameters():
        if name.endswith(('attn.out.weight', 'mlp.proj.weight')):
            nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * N))
