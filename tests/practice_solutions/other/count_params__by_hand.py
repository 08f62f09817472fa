def attention_weights(d_model, n_heads, n_kv_heads):
    d_head = d_model // n_heads
    q = o = d_model * n_heads * d_head
    k = v = d_model * n_kv_heads * d_head
    return q + k + v + o


def mlp_weights(d_model, d_ff, gated):
    return d_model * d_ff * (3 if gated else 2)


GPT2_SMALL_NON_EMBEDDING = 85e6
LLAMA3_70B_ATTENTION_D2 = 2 + 2 * 8 / 64
MLP_SHARE = 8 / 12
