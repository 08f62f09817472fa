"""Key-value memories with a forward hook of its own, and the value read with the final norm's g."""
import torch


@torch.no_grad()
def unit_activations(model, idx, layer):
    seen = []
    down = model.blocks[layer].mlp.down
    handle = down.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    try:
        model(idx)
    finally:
        handle.remove()
    return seen[0]


@torch.no_grad()
def value_logits(model, layer, unit):
    value = model.blocks[layer].mlp.down.weight[:, unit]
    if hasattr(model.ln_f, "b"):               # a LayerNorm removes the mean
        value = value - value.mean()
    value = value / value.norm()               # the size divides every logit alike
    return model.lm_head.weight @ (value * model.ln_f.g)


LAYER, UNIT, TRIGGER = 22, 543, "."
