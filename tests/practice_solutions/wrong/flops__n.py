"""FLOPs, with one mistake: N with the embedding for GPT-2 small"""


def forward_flops(cfg, context):
    d, d_ff = cfg.d_model, cfg.d_ff or 4 * cfg.d_model
    blocks = cfg.n_layers * (4 * d * d + 2 * d * d_ff)
    return 2 * (blocks + cfg.vocab_size * d) + 4 * context * d * cfg.n_layers


TRAIN_GPT2_SMALL_10B = 6 * 124e6 * 1e10
TRAIN_70B_15T = 6.3e24
ATTENTION_CORE_SHARE = 0.22
