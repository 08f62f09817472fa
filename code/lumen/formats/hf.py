"""Hugging Face interop: GPT2LMHeadModel and LlamaForCausalLM state dicts and config.json, both ways.

The key maps are plain tables; GPT-2's only quirk is its Conv1D, which stores weights as (in, out)
and fuses W_Q, W_K, W_V into one c_attn matrix.

    >>> model = load_hf_dir("path/to/hf-dir")            # doctest: +SKIP
    >>> save_hf_dir(model, "out/")                        # transformers' from_pretrained reads it
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch

from ..config import ModelConfig
from ..errors import ConfigError, MissingFileError, ModelFileError
from ..model import GPT
from ..tokenizers import read_json
from .weights import read_safetensors

GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu",
                    "silu": "silu", "swish": "silu"}


# ---------------------------------------------------------------------------------------------
# config.json
def family(cfg: ModelConfig) -> str:
    """Which Hugging Face architecture can hold this config: "gpt2" or "llama"."""
    shape = (cfg.mlp, cfg.norm, cfg.positions, cfg.norm_placement, cfg.bias)
    gpt2 = shape == ("mlp", "layernorm", "learned", "pre", True)
    if gpt2 and cfg.kv_heads == cfg.n_heads:
        return "gpt2"
    if (cfg.mlp, cfg.norm, cfg.positions, cfg.norm_placement) == ("swiglu", "rmsnorm", "rope", "pre"):
        return "llama"
    raise ModelFileError(
        f"config {cfg.name!r} matches no Hugging Face architecture: GPT-2 needs layernorm + mlp + learned positions + "
        "biases + pre-LN; Llama needs rmsnorm + swiglu + rope + pre-LN"
    )


def config_to_hf(cfg: ModelConfig) -> dict:
    if family(cfg) == "gpt2":
        act = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}[cfg.activation]
        return {
            "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": cfg.vocab_size,
            "n_positions": cfg.context, "n_embd": cfg.d_model, "n_layer": cfg.n_layers, "n_head": cfg.n_heads,
            "n_inner": cfg.d_ff, "activation_function": act, "layer_norm_epsilon": cfg.norm_eps,
            "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout, "attn_pdrop": cfg.dropout,
            "tie_word_embeddings": cfg.tie_embeddings, "initializer_range": 0.02,
        }
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model, "intermediate_size": cfg.hidden, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
        "hidden_act": "silu", "max_position_embeddings": cfg.context, "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": cfg.bias, "mlp_bias": False,
        "attention_dropout": cfg.dropout, "initializer_range": 0.02,
    }


# the config.json keys config_from_hf reads, by the type their values must have; and the ones it needs
_HF_INTS = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "hidden_size", "intermediate_size",
            "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "max_position_embeddings", "head_dim")
_HF_FLOATS = ("layer_norm_epsilon", "rms_norm_eps", "rope_theta")
_HF_BOOLS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "scale_attn_by_inverse_layer_idx",
             "reorder_and_upcast_attn")
_HF_REQUIRED = {"gpt2": ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"),
                "llama": ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")}


def check_hf_config(c: object) -> None:
    """The values config_from_hf reads have the types they promise (a damaged config.json fails here with the
    key's name); ModelConfig then checks their ranges. null means "the default" for the optional keys."""
    if not isinstance(c, dict):
        raise ModelFileError(f"the config holds a JSON {type(c).__name__}, not an object")
    kind = c.get("model_type")
    if not isinstance(kind, str):
        raise ModelFileError(f"'model_type' must be a string such as \"llama\", got {kind!r}")
    for key in _HF_REQUIRED.get("llama" if kind in ("mistral", "qwen2") else kind, ()):
        if c.get(key) is None:
            raise ModelFileError(f"the config lacks {key!r}, which a {kind} model needs")
    for keys, ok, what in ((_HF_INTS, lambda v: isinstance(v, int) and v > 0, "a positive whole number"),
                           (_HF_FLOATS, lambda v: isinstance(v, (int, float)) and math.isfinite(v), "a finite number"),
                           (_HF_BOOLS, lambda v: True, "true or false")):
        for key in keys:
            v = c.get(key)
            if (v is not None or keys is _HF_FLOATS and key in c) and (isinstance(v, bool) != (keys is _HF_BOOLS)
                                                                       or not ok(v)):
                raise ModelFileError(f"{key!r} must be {what}, got {v!r}")
    for key in ("rope_parameters", "rope_scaling"):
        if not isinstance(c.get(key), (dict, type(None))):
            raise ModelFileError(f"{key!r} must be an object, got {c[key]!r}")
    rope_theta = (c.get("rope_parameters") or {}).get("rope_theta")
    if rope_theta is not None and (isinstance(rope_theta, bool) or not isinstance(rope_theta, (int, float))):
        raise ModelFileError(f"rope_parameters.rope_theta must be a number, got {rope_theta!r}")


def config_from_hf(c: dict, name: str = "hf") -> ModelConfig:
    check_hf_config(c)
    kind = c.get("model_type")
    if kind == "gpt2":
        act = c.get("activation_function", "gelu_new")
        if act not in GPT2_ACTIVATIONS:
            raise ModelFileError(f"GPT-2 activation {act!r} is not supported; supported: {', '.join(GPT2_ACTIVATIONS)}")
        if c.get("scale_attn_by_inverse_layer_idx") or c.get("reorder_and_upcast_attn"):
            raise ModelFileError(
                "GPT-2 configs with scale_attn_by_inverse_layer_idx/reorder_and_upcast_attn are not supported"
            )
        return ModelConfig(
            name=name, vocab_size=c["vocab_size"], context=c["n_positions"], d_model=c["n_embd"],
            n_layers=c["n_layer"], n_heads=c["n_head"], d_ff=c.get("n_inner"), mlp="mlp",
            activation=GPT2_ACTIVATIONS[act], norm="layernorm", norm_eps=c.get("layer_norm_epsilon", 1e-5),
            positions="learned", bias=True, tie_embeddings=c.get("tie_word_embeddings", True),
        )
    if kind in ("llama", "mistral", "qwen2"):
        rope = c.get("rope_parameters") or {}
        scaling = c.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", scaling.get("rope_type", "default"))
        if rope_type != "default":
            raise ModelFileError(f"RoPE scaling {rope_type!r} is not supported (only plain RoPE)")
        if c.get("mlp_bias"):
            raise ModelFileError("Llama configs with mlp_bias=true are not supported (lumen's SwiGLU has no biases)")
        if c.get("hidden_act", "silu") != "silu":
            raise ModelFileError(f"Llama hidden_act {c['hidden_act']!r} is not supported (only silu)")
        d, h = c["hidden_size"], c["num_attention_heads"]
        if c.get("head_dim") not in (None, d // h):
            raise ModelFileError(
                f"head_dim {c['head_dim']} != hidden_size / num_attention_heads ({d // h}): not supported"
            )
        if c.get("sliding_window") and kind == "mistral":
            raise ModelFileError("sliding-window attention is not supported")
        return ModelConfig(
            name=name, vocab_size=c["vocab_size"], context=c.get("max_position_embeddings", 2048), d_model=d,
            n_layers=c["num_hidden_layers"], n_heads=h, n_kv_heads=c.get("num_key_value_heads") or h,
            d_ff=c["intermediate_size"], mlp="swiglu", activation="silu", norm="rmsnorm",
            norm_eps=c.get("rms_norm_eps", 1e-6), positions="rope",
            rope_theta=float(rope.get("rope_theta", c.get("rope_theta", 10000.0))),
            bias=bool(c.get("attention_bias", kind == "qwen2")), tie_embeddings=c.get("tie_word_embeddings", False),
        )
    raise ModelFileError(
        f"Hugging Face model_type {kind!r} is not supported; supported: gpt2, llama (and mistral/qwen2)"
    )


# ---------------------------------------------------------------------------------------------
# state dicts
_GPT2_BLOCK = {  # lumen name -> GPT-2 name, inside block i; "*" marks a Conv1D weight (stored transposed)
    "ln1.g": "ln_1.weight", "ln1.b": "ln_1.bias", "ln2.g": "ln_2.weight", "ln2.b": "ln_2.bias",
    "attn.out.weight": "attn.c_proj.weight*", "attn.out.bias": "attn.c_proj.bias",
    "mlp.fc.weight": "mlp.c_fc.weight*", "mlp.fc.bias": "mlp.c_fc.bias",
    "mlp.proj.weight": "mlp.c_proj.weight*", "mlp.proj.bias": "mlp.c_proj.bias",
}
_LLAMA_BLOCK = {
    "ln1.g": "input_layernorm.weight", "ln2.g": "post_attention_layernorm.weight",
    "attn.q.weight": "self_attn.q_proj.weight", "attn.k.weight": "self_attn.k_proj.weight",
    "attn.v.weight": "self_attn.v_proj.weight", "attn.out.weight": "self_attn.o_proj.weight",
    "attn.q.bias": "self_attn.q_proj.bias", "attn.k.bias": "self_attn.k_proj.bias",
    "attn.v.bias": "self_attn.v_proj.bias", "attn.out.bias": "self_attn.o_proj.bias",
    "mlp.w_gate.weight": "mlp.gate_proj.weight", "mlp.w_up.weight": "mlp.up_proj.weight",
    "mlp.w_down.weight": "mlp.down_proj.weight",
}
_TOP = {
    "gpt2": {"tok_emb.weight": "transformer.wte.weight", "pos_emb.weight": "transformer.wpe.weight",
             "ln_f.g": "transformer.ln_f.weight", "ln_f.b": "transformer.ln_f.bias",
             "lm_head.weight": "lm_head.weight"},
    "llama": {"tok_emb.weight": "model.embed_tokens.weight", "ln_f.g": "model.norm.weight",
              "lm_head.weight": "lm_head.weight"},
}


def _key_map(cfg: ModelConfig) -> dict[str, str]:
    """lumen parameter name -> HF name, for every parameter of this config."""
    fam = family(cfg)
    prefix, block = ("transformer.h", _GPT2_BLOCK) if fam == "gpt2" else ("model.layers", _LLAMA_BLOCK)
    keys = dict(_TOP[fam])
    for i in range(cfg.n_layers):
        keys.update({f"blocks.{i}.{k}": f"{prefix}.{i}.{v}" for k, v in block.items()})
    return keys


def to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """A lumen state dict in Hugging Face's names and layouts (tied weights stored once)."""
    keys, out = _key_map(cfg), {}
    for name, t in state.items():
        if name == "lm_head.weight" and cfg.tie_embeddings:
            continue
        if family(cfg) == "gpt2" and ".attn." in name and name.split(".attn.")[1].split(".")[0] in "qkv":
            continue  # fused below
        hf = keys[name]
        out[hf.rstrip("*")] = t.t().contiguous() if hf.endswith("*") else t
    if family(cfg) == "gpt2":
        for i in range(cfg.n_layers):  # c_attn = [W_Q | W_K | W_V] as one (d, 3d) Conv1D
            p = f"blocks.{i}.attn."
            fused = torch.cat([state[p + f"{m}.weight"] for m in "qkv"])
            out[f"transformer.h.{i}.attn.c_attn.weight"] = fused.t().contiguous()
            out[f"transformer.h.{i}.attn.c_attn.bias"] = torch.cat([state[p + f"{m}.bias"] for m in "qkv"])
    return out


def from_hf(hf: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """A Hugging Face state dict (GPT-2 or Llama) in lumen's names; raises on missing tensors."""
    keys, out = _key_map(cfg), {}
    with torch.device("meta"):
        template = GPT(cfg)
    for name in template.state_dict():
        if name == "lm_head.weight" and cfg.tie_embeddings:
            continue
        if family(cfg) == "gpt2" and ".attn." in name and name.split(".attn.")[1].split(".")[0] in "qkv":
            i, (m, kind) = int(name.split(".")[1]), name.split(".attn.")[1].split(".")
            fused = _need(hf, f"transformer.h.{i}.attn.c_attn.{kind}")
            fused = fused.t() if kind == "weight" else fused
            out[name] = fused.chunk(3, dim=0)["qkv".index(m)].contiguous()
            continue
        hf_name = keys[name]
        t = _need(hf, hf_name.rstrip("*"))
        out[name] = t.t().contiguous() if hf_name.endswith("*") else t
    if cfg.tie_embeddings:
        out["lm_head.weight"] = out["tok_emb.weight"]
    return out


def _need(hf: dict[str, torch.Tensor], key: str) -> torch.Tensor:
    if key not in hf:
        raise ModelFileError(f"the Hugging Face weights have no tensor {key!r} (is config.json the right one?)")
    return hf[key]


# ---------------------------------------------------------------------------------------------
# directories and live models
def from_hf_model(hf_model: torch.nn.Module) -> GPT:
    """A lumen GPT with the weights of a transformers GPT2LMHeadModel or LlamaForCausalLM."""
    cfg = config_from_hf(hf_model.config.to_dict(), name=hf_model.config.model_type)
    state = {k: v.detach().float() for k, v in hf_model.state_dict().items()}
    return GPT.from_state(cfg, from_hf(state, cfg), source=f"transformers {type(hf_model).__name__}")


def load_hf_dir(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> GPT:
    """Load a Hugging Face-format directory (config.json + model.safetensors, or sharded safetensors)."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise MissingFileError(f"{path} has no config.json (expected a Hugging Face model directory)")
    c = read_json(path / "config.json", "model config")
    try:
        cfg = config_from_hf(c, name=path.name)
    except (ModelFileError, ConfigError) as e:  # (ConfigError: a value out of ModelConfig's ranges)
        raise ModelFileError(f"{path / 'config.json'}: {e}") from None
    hf: dict[str, torch.Tensor] = {}
    for f in weight_files(path):
        hf.update(read_safetensors(f))
    layers = {int(m.group(1)) for k in hf if (m := re.search(r"\.(?:layers|h)\.(\d+)\.", k))}
    if layers != set(range(cfg.n_layers)):
        raise ModelFileError(f"{path}: config.json says {cfg.n_layers} layers but the weights hold layers "
                             f"{sorted(layers)[:8]}{'...' if len(layers) > 8 else ''}; they belong to different models")
    try:
        state = from_hf(hf, cfg)
    except ModelFileError as e:
        raise ModelFileError(f"{path}: {e}") from None
    return GPT.from_state(cfg, state, source=str(path), dtype=dtype).to(device)


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a Hugging Face directory: the shards model.safetensors.index.json names, or
    model.safetensors. Other *.safetensors files beside them (adapters, old copies) are not the model's."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index, "weights index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelFileError(f"{index} has no weight_map of tensor names to files; the directory is damaged")
        names = set(weight_map.values())
        if not all(isinstance(n, str) and n == Path(n).name and n.endswith(".safetensors") for n in names):
            raise ModelFileError(f"{index}: the weight_map must name .safetensors files in {path}, got "
                                 f"{sorted(map(str, names))[:3]}")
        for n in names:
            if not (path / n).is_file():
                raise MissingFileError(f"{path} lacks {n}, a shard that {index.name} names; download it again")
        return [path / n for n in sorted(names)]
    if not (path / "model.safetensors").is_file():
        found = ", ".join(sorted(p.name for p in path.glob("*.safetensors"))[:3]) or "none"
        raise MissingFileError(f"{path} has no model.safetensors or model.safetensors.index.json (*.safetensors "
                               f"found: {found}); pickled .bin files are not read: convert them")
    return [path / "model.safetensors"]


def save_hf_dir(model: GPT, path: str | Path) -> Path:
    """Write config.json + model.safetensors that transformers' from_pretrained loads. Written into a
    temporary folder beside `path` and renamed into place, so a failed save leaves nothing half-written."""
    from safetensors.torch import save_file

    path = Path(path)
    if path.exists() and any(path.iterdir()):
        raise FileExistsError(f"{path} exists and is not empty (choose a new output directory)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.partial-"))
    try:
        state = {k: v.detach().cpu().contiguous() for k, v in to_hf(model.state_dict(), model.cfg).items()}
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        hf_cfg = config_to_hf(model.cfg) | {"torch_dtype": str(model.lm_head.weight.dtype).removeprefix("torch.")}
        (tmp / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")
        if path.exists():
            path.rmdir()
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
