"""Key-value memories with one mistake: a unit that does not fire on one token"""
import torch

from lumen.block import LayerNorm
from lumen.inspect import capture


@torch.no_grad()
def unit_activations(model, idx, layer):
    return capture(model, idx, f"blocks.{layer}.mlp_hidden")


@torch.no_grad()
def value_logits(model, layer, unit):
    value = model.blocks[layer].mlp.down.weight[:, unit]
    if isinstance(model.ln_f, LayerNorm):
        value = value - value.mean()
    return model.lm_head(value * model.ln_f.gain)


LAYER, UNIT, TRIGGER = 22, 0, " the"
