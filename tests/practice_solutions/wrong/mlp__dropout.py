"""An MLP that makes one mistake: dropout applied in every mode"""
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, d_model, d_ff=None, dropout=0.0):
        super().__init__()
        d_ff = d_ff or 4 * d_model
        self.fc = nn.Linear(d_model, d_ff)
        self.proj = nn.Linear(d_ff, d_model)
        self.drop = nn.Dropout(dropout)
        self.p = dropout

    def forward(self, x):
        return F.dropout(self.proj(F.gelu(self.fc(x))), self.p, training=True)
