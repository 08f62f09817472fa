"""Key-value memories with one mistake: the value not centred for a LayerNorm"""
import torch

from lumen.inspect import capture


@torch.no_grad()
def unit_activations(model, idx, layer):
    return capture(model, idx, f"blocks.{layer}.mlp_hidden")


@torch.no_grad()
def value_logits(model, layer, unit):
    value = model.blocks[layer].mlp.down.weight[:, unit]
    return model.lm_head(value * model.ln_f.gain)


LAYER, UNIT, TRIGGER = 22, 543, "."
