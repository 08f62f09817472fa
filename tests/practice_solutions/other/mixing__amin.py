import torch


def reachable_range(values):
    return torch.amin(values, dim=0), torch.amax(values, dim=0)
