"""SwiGLU with raw (in, out) matrices in small modules of its own."""
import torch
import torch.nn as nn


class Matrix(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.W = nn.Parameter(torch.randn(d_in, d_out) * 0.02)

    def forward(self, x):
        return x @ self.W


class SwiGLU(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w_gate, self.w_up, self.w_down = Matrix(d_model, d_ff), Matrix(d_model, d_ff), Matrix(d_ff, d_model)

    def forward(self, x):
        gate = self.w_gate(x)
        return self.w_down(gate * torch.sigmoid(gate) * self.w_up(x))
