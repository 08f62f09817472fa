from lumen.block import MLP as _MLP


class MLP(_MLP):
    def __init__(self, d_model, d_ff=None, dropout=0.0):
        super().__init__(d_model, d_ff, dropout, activation="gelu")   # the chapter's exact GELU
