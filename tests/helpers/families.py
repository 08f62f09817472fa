"""Random-weight Hugging Face models of the families lumen reads (GPT-NeoX, Qwen2, Gemma, Mistral), several
shapes each, as the parity tests' references: name -> a function that builds one."""

from transformers import (
    GemmaConfig,
    GemmaForCausalLM,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

V = 97
SHAPES = {
    "neox-parallel": lambda: GPTNeoXForCausalLM(GPTNeoXConfig(
        vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        max_position_embeddings=48, rotary_pct=0.25, hidden_act="gelu")),
    "neox-sequential-half": lambda: GPTNeoXForCausalLM(GPTNeoXConfig(
        vocab_size=V, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=3,
        max_position_embeddings=48, rotary_pct=0.5, rotary_emb_base=1000, use_parallel_residual=False,
        hidden_act="gelu_new", tie_word_embeddings=True)),
    "qwen2-gqa": lambda: Qwen2ForCausalLM(Qwen2Config(
        vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=48, rope_theta=100000.0)),
    "qwen2-tied-mha": lambda: Qwen2ForCausalLM(Qwen2Config(
        vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=6, max_position_embeddings=48, tie_word_embeddings=True)),
    "gemma-mqa-wide-heads": lambda: GemmaForCausalLM(GemmaConfig(
        vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=1, head_dim=32, max_position_embeddings=48)),
    "gemma-gqa-narrow-heads": lambda: GemmaForCausalLM(GemmaConfig(
        vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=48, hidden_act="gelu")),
    "mistral-window-5": lambda: MistralForCausalLM(MistralConfig(
        vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=48, sliding_window=5)),
    "mistral-window-12-mqa": lambda: MistralForCausalLM(MistralConfig(
        vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=48, sliding_window=12, tie_word_embeddings=True)),
}
# families-b: Gemma 2 (sandwich norms, soft-capping, alternating windows), SmolLM3 (no RoPE on every 4th layer)
from transformers import Gemma2Config, Gemma2ForCausalLM, SmolLM3Config, SmolLM3ForCausalLM  # noqa: E402

SHAPES |= {
    "gemma2-window-4-softcap": lambda: Gemma2ForCausalLM(Gemma2Config(
        vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=48, sliding_window=4,
        query_pre_attn_scalar=24, attn_logit_softcapping=2.0, final_logit_softcapping=3.0)),
    "gemma2-mqa-no-caps-untied": lambda: Gemma2ForCausalLM(Gemma2Config(
        vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=8, max_position_embeddings=48, sliding_window=7,
        layer_types=["full_attention", "sliding_attention"], attn_logit_softcapping=None,
        final_logit_softcapping=None, tie_word_embeddings=False)),
    "smollm3-nope-every-2nd": lambda: SmolLM3ForCausalLM(SmolLM3Config(
        vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=48, no_rope_layer_interval=2, pad_token_id=0,
        bos_token_id=1, eos_token_id=2)),
    "smollm3-default-pattern": lambda: SmolLM3ForCausalLM(SmolLM3Config(
        vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=5, num_attention_heads=6,
        num_key_value_heads=3, max_position_embeddings=48, tie_word_embeddings=False, pad_token_id=0,
        bos_token_id=1, eos_token_id=2)),
}
HF_CLASSES = {"gpt_neox": GPTNeoXForCausalLM, "qwen2": Qwen2ForCausalLM, "gemma": GemmaForCausalLM,
              "mistral": MistralForCausalLM}
HF_CLASSES |= {"gemma2": Gemma2ForCausalLM, "smollm3": SmolLM3ForCausalLM}  # families-b
