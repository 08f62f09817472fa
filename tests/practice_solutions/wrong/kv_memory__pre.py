"""Key-value memories with one mistake: the activations read before GELU"""
import torch

from lumen.block import LayerNorm
from lumen.inspect import capture


@torch.no_grad()
def unit_activations(model, idx, layer):
    block = model.blocks[layer]
    return block.mlp.fc(block.ln2(capture(model, idx, f"blocks.{layer}.resid_mid")))


@torch.no_grad()
def value_logits(model, layer, unit):
    value = model.blocks[layer].mlp.down.weight[:, unit]
    if isinstance(model.ln_f, LayerNorm):
        value = value - value.mean()
    return model.lm_head(value * model.ln_f.gain)


LAYER, UNIT, TRIGGER = 22, 543, "."
