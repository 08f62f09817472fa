"""Counting weights, with one mistake: grouped-query attention's smaller W_K and W_V ignored"""


def attention_weights(d_model, n_heads, n_kv_heads):
    return 4 * d_model * d_model


def mlp_weights(d_model, d_ff, gated):
    return (3 if gated else 2) * d_model * d_ff


GPT2_SMALL_NON_EMBEDDING = 12 * 12 * 768 ** 2
LLAMA3_70B_ATTENTION_D2 = 4.0
MLP_SHARE = 2 / 3
