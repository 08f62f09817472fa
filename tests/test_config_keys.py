"""No silently ignored config.json keys: for each family, a tiny random-weight model that transformers' own classes
build is saved; then each key of its config.json (nested rope_parameters' keys and a list's elements too:
layer_types, no_rope_layers) is changed in turn to another valid value. Wherever transformers still loads the
file, lumen must either follow the change (its logits equal transformers' to 5e-5 relative) or refuse the file
with a ModelFileError naming the key. A key lumen ignored while transformers' logits moved is the bug this test
exists for (GPT-2's scale_attn_weights once was one)."""

import json
import shutil

import pytest
import torch
import transformers

from helpers.families import LLAMA3_ROPE
from lumen.errors import ModelFileError
from lumen.formats import load
from lumen.formats.hf import config_from_hf

V = 97
SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=40)
# family -> (config class, model class, the config's arguments); the llama family is the default tier's
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", SMALL | {"num_key_value_heads": 2}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(vocab_size=V, n_positions=40, n_embd=32, n_layer=2, n_head=4)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", SMALL | {"hidden_act": "gelu"}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", SMALL | {"num_key_value_heads": 2}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", SMALL | {"num_key_value_heads": 1, "head_dim": 16}),
    "mistral": ("MistralConfig", "MistralForCausalLM", SMALL | {"num_key_value_heads": 2, "sliding_window": 6}),
    # families-a
    "llama3": ("LlamaConfig", "LlamaForCausalLM", SMALL | {"max_position_embeddings": 128,
                                                           "rope_parameters": LLAMA3_ROPE}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", SMALL | {"num_key_value_heads": 2, "head_dim": 16}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", SMALL | {"num_key_value_heads": 2}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", SMALL | {"num_key_value_heads": 2, "pad_token_id": 0,
                                                       "original_max_position_embeddings": 40}),
    "phi": ("PhiConfig", "PhiForCausalLM", SMALL),
    "gptj": ("GPTJConfig", "GPTJForCausalLM", dict(vocab_size=V, n_positions=40, n_embd=32, n_layer=2, n_head=2,
                                                   rotary_dim=8)),
    # families-b (small caps and windows, so that the keys about them change the logits)
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", SMALL | {"num_key_value_heads": 2, "head_dim": 16,
                                                             "sliding_window": 6, "attn_logit_softcapping": 3.0,
                                                             "final_logit_softcapping": 4.0}),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", SMALL | {"num_key_value_heads": 1, "head_dim": 16,
                                                                      "sliding_window": 6}),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", SMALL | {"num_key_value_heads": 2, "pad_token_id": 0,
                                                                "bos_token_id": 1, "eos_token_id": 2}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", SMALL | {"num_key_value_heads": 2, "head_dim": 16,
                                                                    "moe_intermediate_size": 16, "num_experts": 4,
                                                                    "num_experts_per_tok": 2}),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", SMALL | {"num_key_value_heads": 2, "intermediate_size": 16,
                                                          "num_experts": 4, "num_experts_per_tok": 2}),
}
# keys that do not describe the model: how transformers returns results, which precision to load in (lumen's own
# choice, --dtype), bookkeeping; and "model_type", which names another family altogether
NOT_THE_MODEL = {"return_dict", "output_attentions", "output_hidden_states", "use_cache", "dtype", "torch_dtype",
                 "transformers_version", "model_type", "architectures", "_name_or_path", "id2label", "label2id"}
# another valid value for a string key, where one exists
OTHER_STRINGS = {"hidden_act": "relu", "hidden_activation": "relu", "activation_function": "relu",
                 "rope_type": "linear"}


def _other(key: str, value: object) -> object | None:
    """A different valid value of the same type, or None where there is none to try."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 1.5 if value else 0.5
    if isinstance(value, str):
        other = OTHER_STRINGS.get(key)
        return other if other != value else None
    return None


# another valid value for an element of a list (HF's layer_types)
OTHER_ELEMENTS = {"sliding_attention": "full_attention", "full_attention": "sliding_attention"}


def _element(key: str, value: object) -> object | None:
    """Another valid value for one element of a list: the other layer type, 0 <-> 1 (SmolLM3's no_rope_layers)."""
    if isinstance(value, str):
        return OTHER_ELEMENTS.get(value)
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
        return 1 - value
    return _other(key, value)


def _variants(key: str, value: object):
    """(suffix, changed value) for each change of one value: a scalar's other value, a list's first element
    changed, and every key of a nested table, recursively (Gemma 3's rope_parameters per layer kind)."""
    if isinstance(value, dict):
        for sub, v in value.items():
            for suffix, new in _variants(sub, v):
                yield f".{sub}{suffix}", value | {sub: new}
    elif isinstance(value, list):
        new = _element(key, value[0]) if value else None
        if new is not None:
            yield "[0]", [new, *value[1:]]
    else:
        new = _other(key, value)
        if new is not None:
            yield "", new


def _changes(config: dict):
    """(name, changed config) for every key: nested tables' keys and lists' elements included."""
    for key, value in config.items():
        if key in NOT_THE_MODEL:
            continue
        for suffix, new in _variants(key, value):
            yield f"{key}{suffix}", config | {key: new}


@torch.no_grad()
def _hf_logits(path, idx):
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
        return model(idx).logits.float()
    except Exception:  # noqa: BLE001  (transformers refuses the changed config: nothing to compare)
        return None


@pytest.fixture(autouse=True)
def _quiet_transformers():
    """transformers reports every reinitialised weight: expected here, hundreds of times."""
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    yield
    transformers.logging.set_verbosity(level)
    transformers.logging.enable_progress_bar()


def _check_family(family: str, tmp_path) -> list[str]:
    config_class, model_class, kwargs = FAMILIES[family]
    torch.manual_seed(0)
    hf = getattr(transformers, model_class)(getattr(transformers, config_class)(**kwargs)).eval()
    with torch.no_grad():  # norms and biases away from their init, so that keys about them matter
        for p in hf.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    base = tmp_path / "base"
    hf.save_pretrained(base)
    config = json.loads((base / "config.json").read_text())
    idx = torch.randint(0, V, (1, 24), generator=torch.Generator().manual_seed(1))
    followed = []
    for name, changed in _changes(config):
        d = tmp_path / name
        shutil.copytree(base, d)
        (d / "config.json").write_text(json.dumps(changed))
        ref = _hf_logits(d, idx)
        if ref is None:
            continue
        try:
            with torch.no_grad():
                ours = load(d).model(idx)[0]
        except ModelFileError as e:
            key = name.split(".")[-1].split("[")[0]
            assert key in str(e) or name in str(e), f"{name}: refused without naming it: {e}"
            assert "\n" not in str(e)
            continue
        err = ((ours - ref).abs().max() / ref.abs().max()).item()
        assert err < 5e-5, f"{family}: {name}={changed.get(name, '(nested)')!r} changes transformers' logits " \
                           f"(relative {err:.2e}) and lumen ignored it"
        followed.append(name)
    return followed


def test_every_key_of_a_llama_config_is_followed_or_refused(tmp_path):
    followed = _check_family("llama", tmp_path)
    # the keys that change the math are among those followed (not skipped)
    assert {"rms_norm_eps", "rope_parameters.rope_theta"} <= set(followed)


@pytest.mark.slow
@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "llama"])
def test_every_key_of_each_family_config_is_followed_or_refused(family, tmp_path):
    _check_family(family, tmp_path)


def test_unknown_model_types_and_rope_variants_are_refused_in_one_line():
    for c, key in (({"model_type": "bert"}, "model_type"),
                   ({"model_type": "llama"} | SMALL | {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}},
                    "rope_parameters.rope_type 'yarn'"),
                   ({"model_type": "llama"} | SMALL | {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
                    "rope_scaling.rope_type 'dynamic'"),
                   ({"model_type": "phi3"} | SMALL | {"rope_scaling": {"type": "longrope"}}, "'longrope'")):
        with pytest.raises(ModelFileError, match=key.replace(".", r"\.")) as e:
            config_from_hf(c)
        assert "\n" not in str(e.value)
