"""The chapter's init: _init_weights applied to every module, then the two writes per block redrawn."""
import math

import torch.nn as nn


def init_gpt2(model):
    def init(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    model.apply(init)
    for name, p in model.named_parameters():
        if name.endswith("attn.out.weight") or name.endswith("mlp.proj.weight"):
            nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * model.n_layers))
