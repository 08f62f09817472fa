"""Counting weights, with one mistake: the MLP's share of attention, not of the block"""


def attention_weights(d_model, n_heads, n_kv_heads):
    d_head = d_model // n_heads
    return 2 * d_model * d_model + 2 * d_model * n_kv_heads * d_head


def mlp_weights(d_model, d_ff, gated):
    return (3 if gated else 2) * d_model * d_ff


GPT2_SMALL_NON_EMBEDDING = 85_000_000
LLAMA3_70B_ATTENTION_D2 = 2.25
MLP_SHARE = 2.0
