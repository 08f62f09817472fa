from lumen.accounting import count, formula
from lumen.config import ModelConfig


def _cfg(d_model, n_heads, n_kv_heads=None, d_ff=None, gated=False):
    return ModelConfig(vocab_size=8, d_model=d_model, n_layers=1, n_heads=n_heads, n_kv_heads=n_kv_heads, d_ff=d_ff,
                       mlp="swiglu" if gated else "mlp")


def attention_weights(d_model, n_heads, n_kv_heads):
    return formula(_cfg(d_model, n_heads, n_kv_heads)).attention


def mlp_weights(d_model, d_ff, gated):
    return formula(_cfg(d_model, 1, d_ff=d_ff, gated=gated)).mlp


GPT2_SMALL_NON_EMBEDDING = count(ModelConfig.from_name("gpt2")).non_embedding
_llama = ModelConfig.from_name("llama3-70b")
LLAMA3_70B_ATTENTION_D2 = formula(_llama).attention / _llama.d_model ** 2
_gpt2 = formula(ModelConfig.from_name("gpt2"))
MLP_SHARE = _gpt2.mlp / _gpt2.block
