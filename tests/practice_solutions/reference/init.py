import torch

from lumen import GPT


@torch.no_grad()
def init_gpt2(model):
    """lumen's own initialisation: a fresh GPT of the same config, its weights copied in."""
    fresh = GPT(model.cfg)
    for name, p in model.named_parameters():
        p.copy_(fresh.get_parameter(name))
