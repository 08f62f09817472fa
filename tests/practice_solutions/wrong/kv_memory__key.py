"""Key-value memories with one mistake: the key (W1's row) read instead of the value"""
import torch

from lumen.block import LayerNorm
from lumen.inspect import capture


@torch.no_grad()
def unit_activations(model, idx, layer):
    return capture(model, idx, f"blocks.{layer}.mlp_hidden")


@torch.no_grad()
def value_logits(model, layer, unit):
    mlp = model.blocks[layer].mlp
    key = (mlp.fc if hasattr(mlp, 'fc') else mlp.w_up).weight[unit]
    if isinstance(model.ln_f, LayerNorm):
        key = key - key.mean()
    return model.lm_head(key * model.ln_f.gain)


LAYER, UNIT, TRIGGER = 22, 543, "."
