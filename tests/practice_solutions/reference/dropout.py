import torch.nn as nn


class Dropout(nn.Dropout):   # what lumen's blocks use
    def __init__(self, p=0.1):
        super().__init__(p)
