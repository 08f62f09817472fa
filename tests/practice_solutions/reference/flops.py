from lumen.accounting import count, forward_flops_per_token, report, training_flops
from lumen.config import ModelConfig


def forward_flops(cfg, context):
    return forward_flops_per_token(cfg, context)["total"]


TRAIN_GPT2_SMALL_10B = training_flops(count(ModelConfig.from_name("gpt2")).non_embedding, 1e10)
TRAIN_70B_15T = training_flops(count(ModelConfig.from_name("llama3-70b")).non_embedding, 15e12)
ATTENTION_CORE_SHARE = report(ModelConfig.from_name("gpt2"), 1024)["attention_core_share"]
