def forward_flops(cfg, context):
    d = cfg.d_model
    d_ff = cfg.d_ff if cfg.d_ff else 4 * d
    matmul_weights = cfg.n_layers * (4 * d * d + 2 * d * d_ff) + d * cfg.vocab_size
    return 2 * matmul_weights + 4 * context * d * cfg.n_layers


TRAIN_GPT2_SMALL_10B = 6 * 85e6 * 1e10       # the chapter: ~5e18
TRAIN_70B_15T = 6 * 7e10 * 1.5e13             # the chapter: ~6e24
ATTENTION_CORE_SHARE = 4 * 1024 * 768 * 12 / (2 * 85e6)
