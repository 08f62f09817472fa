from lumen.inspect import logit_lens


def logit_lens_top1(model, idx):
    return logit_lens(model, idx, k=1).top_ids[..., 0]
