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

# --- families-a: Llama 3.x (RoPE scaling), Qwen3, OLMo-2, Phi-3, Phi-2, GPT-J ---------------------------------
from transformers import (  # noqa: E402
    GPTJConfig,
    GPTJForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    PhiConfig,
    PhiForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

# Llama 3.1's frequency rescaling at a context short enough that all three bands (kept, blended, stretched) occur
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
SHAPES_A = {
    "llama3-scaled-gqa": lambda: LlamaForCausalLM(LlamaConfig(
        vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, rope_parameters=LLAMA3_ROPE, tie_word_embeddings=True)),
    "llama-linear-scaled": lambda: LlamaForCausalLM(LlamaConfig(
        vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=48, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0})),
    "qwen3-gqa": lambda: Qwen3ForCausalLM(Qwen3Config(
        vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=24, max_position_embeddings=48, tie_word_embeddings=True)),
    "olmo2-gqa": lambda: Olmo2ForCausalLM(Olmo2Config(
        vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=48, pad_token_id=0, eos_token_id=1)),
    "phi3-window": lambda: Phi3ForCausalLM(Phi3Config(
        vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=48, original_max_position_embeddings=48, sliding_window=7,
        pad_token_id=0)),
    "phi2-partial-qk-layernorm": lambda: PhiForCausalLM(PhiConfig(
        vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=48, qk_layernorm=True)),
    "gptj-rotary-16": lambda: GPTJForCausalLM(GPTJConfig(
        vocab_size=V, n_positions=48, n_embd=64, n_layer=2, n_head=2, rotary_dim=16, bos_token_id=1, eos_token_id=1)),
}
SHAPES |= SHAPES_A
HF_CLASSES |= {"qwen3": Qwen3ForCausalLM, "olmo2": Olmo2ForCausalLM, "phi3": Phi3ForCausalLM, "phi": PhiForCausalLM,
               "gptj": GPTJForCausalLM, "llama": LlamaForCausalLM}

# families-b: Gemma 3 (q/k norms with Gemma's (1 + w), 5 local : 1 global, two RoPE bases), Qwen3-MoE (experts)
from transformers import (  # noqa: E402
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

SHAPES |= {
    "gemma3-5-local-1-global": lambda: Gemma3ForCausalLM(Gemma3TextConfig(
        vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=48, sliding_window=4, query_pre_attn_scalar=20,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1000.0}})),
    "gemma3-mqa-untied": lambda: Gemma3ForCausalLM(Gemma3TextConfig(
        vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=1, head_dim=8, max_position_embeddings=48, sliding_window=6, tie_word_embeddings=False,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
    "qwen3moe-top2-normed": lambda: Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=V, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=48, num_experts=6,
        num_experts_per_tok=2, norm_topk_prob=True)),
    "qwen3moe-top3-raw-tied": lambda: Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=V, hidden_size=48, intermediate_size=64, moe_intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=48, num_experts=5,
        num_experts_per_tok=3, norm_topk_prob=False, tie_word_embeddings=True)),
}
HF_CLASSES |= {"gemma3_text": Gemma3ForCausalLM, "qwen3_moe": Qwen3MoeForCausalLM}

# OLMoE: q/k norms over the whole projection in a pre-LN block, experts whose top-k weights are not renormalised
from transformers import OlmoeConfig, OlmoeForCausalLM  # noqa: E402

SHAPES |= {
    "olmoe-top2-raw-gqa": lambda: OlmoeForCausalLM(OlmoeConfig(
        vocab_size=V, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=48, num_experts=6, num_experts_per_tok=2,
        pad_token_id=0, bos_token_id=None, eos_token_id=1)),
    "olmoe-top3-normed-tied": lambda: OlmoeForCausalLM(OlmoeConfig(
        vocab_size=V, hidden_size=48, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
        max_position_embeddings=48, num_experts=5, num_experts_per_tok=3, norm_topk_prob=True,
        tie_word_embeddings=True, pad_token_id=0, bos_token_id=None, eos_token_id=1)),
}
HF_CLASSES |= {"olmoe": OlmoeForCausalLM}
