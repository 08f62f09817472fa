"""A range wider than attention can reach: the smallest and largest value of any coordinate, for all."""
import torch


def reachable_range(values):
    d = values.size(1)
    return torch.full((d,), values.min().item()), torch.full((d,), values.max().item())
