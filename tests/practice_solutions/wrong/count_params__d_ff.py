"""Counting weights, with one mistake: the MLP always counted at 4d"""


def attention_weights(d_model, n_heads, n_kv_heads):
    d_head = d_model // n_heads
    return 2 * d_model * d_model + 2 * d_model * n_kv_heads * d_head


def mlp_weights(d_model, d_ff, gated):
    return (3 if gated else 2) * d_model * 4 * d_model


GPT2_SMALL_NON_EMBEDDING = 12 * 12 * 768 ** 2
LLAMA3_70B_ATTENTION_D2 = 2.25
MLP_SHARE = 2 / 3
