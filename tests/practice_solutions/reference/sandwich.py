"""lumen's SandwichBlock, its four norms Gemma's RMSNorm (lumen sets the post norms in from_config)."""
from lumen.block import OffsetRMSNorm
from lumen.block import SandwichBlock as LumensSandwichBlock


class SandwichBlock(LumensSandwichBlock):
    def __init__(self, d_model, n_heads, d_ff=None, dropout=0.0):
        super().__init__(d_model, n_heads, d_ff, dropout)
        self.ln1, self.ln2 = OffsetRMSNorm(d_model), OffsetRMSNorm(d_model)
        self.ln1_post, self.ln2_post = OffsetRMSNorm(d_model), OffsetRMSNorm(d_model)
