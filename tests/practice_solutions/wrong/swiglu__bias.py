"""SwiGLU with one mistake: biases on the three matrices"""
import torch.nn as nn
import torch.nn.functional as F


class SwiGLU(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w_gate = nn.Linear(d_model, d_ff, bias=True)
        self.w_up = nn.Linear(d_model, d_ff, bias=True)
        self.w_down = nn.Linear(d_ff, d_model, bias=True)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))
