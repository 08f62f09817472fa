"""SAELens's directory format, both ways: `cfg.json` + `sae_weights.safetensors`.

    cfg.json                 {"architecture": "topk", "d_in": 576, "d_sae": 4608, "k": 32,
                              "apply_b_dec_to_input": true, "normalize_activations": "none",
                              "metadata": {"hook_name": "blocks.8.hook_resid_post", ...}, ...}
    sae_weights.safetensors  W_enc (d_in, d_sae), b_enc, W_dec (d_sae, d_in), b_dec; threshold (JumpReLU);
                             W_skip (d_out, d_in) for a skip transcoder

Hook names are TransformerLens's spelling (`blocks.8.hook_resid_pre`) and become lumen's sites
(`blocks.8.resid_pre`). Weights are read with safetensors, never unpickled.

    >>> sae = read_saelens("gemma-scope/layer_8")                       # doctest: +SKIP
    >>> save_saelens(sae, "out/my-sae")                                 # doctest: +SKIP
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .. import names
from ..errors import MissingFileError, ModelFileError
from ..files import atomic_dir, read_json
from ..formats.hf import hub_snapshot
from .dictionary import SAE, BatchTopK, JumpReLU, ReLU, TopK, Transcoder

CONFIG, WEIGHTS = "cfg.json", "sae_weights.safetensors"
# SAELens's architectures lumen reads: (the activation, whether it is a transcoder, whether it has W_skip)
ARCHITECTURES = {"standard": ("relu", False, False), "topk": ("topk", False, False),
                 "batchtopk": ("batchtopk", False, False), "jumprelu": ("jumprelu", False, False),
                 "transcoder": ("relu", True, False), "skip_transcoder": ("relu", True, True),
                 "jumprelu_transcoder": ("jumprelu", True, False)}
# TransformerLens's hook names inside block i -> lumen's sites (lumen.names)
_TL_SITES = {"hook_resid_pre": "resid_pre", "hook_resid_mid": "resid_mid", "hook_resid_post": "resid_post",
             "hook_attn_out": "attn_out", "hook_mlp_out": "mlp_out", "mlp.hook_post": "mlp_hidden",
             "mlp.hook_pre": "mlp_pre", "ln2.hook_normalized": "mlp_in"}
_TL_NAME = re.compile(r"blocks\.(\d+)\.(.+)")


def site_from_hook(hook: str) -> str:
    """lumen's site for a TransformerLens hook name (`blocks.8.hook_resid_pre` -> `blocks.8.resid_pre`); a lumen
    name is kept as it is."""
    m = _TL_NAME.fullmatch(hook)
    if m and m.group(2) in _TL_SITES:
        return names.activation(int(m.group(1)), _TL_SITES[m.group(2)])
    if m and m.group(2) in names.KINDS:
        return hook
    raise ModelFileError(f"hook name {hook!r} has no lumen site; lumen reads dictionaries on "
                         f"blocks.N.{{{','.join(_TL_SITES)}}} (or lumen's own names, e.g. blocks.N.resid_post)")


def hook_from_site(site: str) -> str:
    """TransformerLens's hook name for a lumen site (the inverse of `site_from_hook`)."""
    layer, kind, _ = names.parse(site)
    back = {v: k for k, v in _TL_SITES.items()}
    return f"blocks.{layer}.{back[kind]}" if layer is not None and kind in back else site


def locate(spec: str | Path) -> Path:
    """A dictionary's folder: a local path, or `hf:ORG/NAME[@REVISION]/FOLDER` (a folder of a hub repository,
    fetched into the Hugging Face cache: its cfg.json and sae_weights.safetensors only)."""
    if not str(spec).startswith("hf:"):
        return Path(spec)
    repo, _, folder = str(spec)[3:].partition("/")
    name, _, inner = folder.partition("/")
    repo = f"{repo}/{name}"
    inner = inner.strip("/")
    files = [f"{inner}/{f}" if inner else f for f in (CONFIG, WEIGHTS)]
    return hub_snapshot(repo, files) / inner


def read_saelens(path: str | Path) -> SAE:
    """The dictionary in a SAELens directory (cfg.json + sae_weights.safetensors; a local folder or
    hf:ORG/NAME/FOLDER), checked: its architecture is one lumen knows, every tensor is there with the shape
    cfg.json gives, and its hook names a lumen site."""
    path = locate(path)
    if not path.is_dir():
        raise MissingFileError(f"{path}: no such directory (a SAELens dictionary is a folder with {CONFIG} and "
                               f"{WEIGHTS})")
    cfg = read_json(path / CONFIG, "SAELens config")
    arch = cfg.get("architecture", "standard")
    if arch not in ARCHITECTURES:
        raise ModelFileError(f"{path / CONFIG}: architecture {arch!r} is not one lumen reads "
                             f"({', '.join(ARCHITECTURES)})")
    kind, transcoder, skip = ARCHITECTURES[arch]
    d_in, d_sae = _whole(cfg, "d_in", path), _whole(cfg, "d_sae", path)
    d_out = _whole(cfg, "d_out", path) if transcoder else d_in
    meta: dict = cfg["metadata"] if isinstance(cfg.get("metadata"), dict) else {}
    hook = meta.get("hook_name") or cfg.get("hook_name")
    if not isinstance(hook, str):
        raise ModelFileError(f"{path / CONFIG} names no hook_name: which site the dictionary reads is unknown")
    site = site_from_hook(hook)
    normalize = cfg.get("normalize_activations", "none")
    if normalize == "expected_average_only_in":  # SAELens folds its scale into the weights; inference reads as is
        normalize = "none"
    if normalize not in ("none", "constant_norm_rescale", "layer_norm"):
        raise ModelFileError(f"{path / CONFIG}: normalize_activations {normalize!r} is not one lumen applies")
    if cfg.get("rescale_acts_by_decoder_norm") or cfg.get("reshape_activations", "none") != "none":
        what = "rescale_acts_by_decoder_norm" if cfg.get("rescale_acts_by_decoder_norm") else "reshape_activations"
        raise ModelFileError(f"{path / CONFIG}: {what} is not supported by lumen yet")
    act = _activation(kind, cfg, d_sae, path)
    if transcoder:
        out_hook = meta.get("hook_name_out") or cfg.get("hook_name_out")
        site_out = site_from_hook(out_hook) if isinstance(out_hook, str) else _mlp_out_of(site, path)
        sae: SAE = Transcoder(d_in, d_sae, act, site, site_out, d_out, skip, normalize)
    else:
        sae = SAE(d_in, d_sae, act, site, bool(cfg.get("apply_b_dec_to_input", True)), normalize)
    _load_weights(sae, path / WEIGHTS)
    return sae


def save_saelens(sae: SAE, path: str | Path) -> Path:
    """Write a dictionary as SAELens writes one (atomically): cfg.json and sae_weights.safetensors."""
    arch = _architecture(sae)
    cfg: dict = {"architecture": arch, "d_in": sae.d_in, "d_sae": sae.d_sae, "dtype": "float32", "device": "cpu",
                 "apply_b_dec_to_input": sae.apply_b_dec_to_input, "normalize_activations": sae.normalize,
                 "reshape_activations": "none", "metadata": {"hook_name": hook_from_site(sae.site)}}
    if isinstance(sae.act, TopK | BatchTopK):
        cfg["k"] = sae.act.k
    if isinstance(sae, Transcoder):
        cfg["d_out"] = sae.W_dec.shape[1]
        cfg["metadata"]["hook_name_out"] = hook_from_site(sae.site_out)
    tensors = {k: v.detach().float().contiguous().cpu() for k, v in sae.state_dict().items()}
    if "act.threshold" in tensors:
        tensors["threshold"] = tensors.pop("act.threshold")
    with atomic_dir(path) as tmp:
        save_file(tensors, str(tmp / WEIGHTS))
        (tmp / CONFIG).write_text(json.dumps(cfg, indent=1) + "\n")
    return Path(path)


def _architecture(sae: SAE) -> str:
    if isinstance(sae, Transcoder):
        if sae.W_skip is not None:
            return "skip_transcoder"
        return "jumprelu_transcoder" if isinstance(sae.act, JumpReLU) else "transcoder"
    return {ReLU: "standard", TopK: "topk", BatchTopK: "batchtopk", JumpReLU: "jumprelu"}[type(sae.act)]


def _whole(cfg: dict, key: str, path: Path) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 2**24:
        raise ModelFileError(f"{path / CONFIG}: {key} must be a whole number from 1 to 2^24, got {v!r}")
    return v


def _activation(kind: str, cfg: dict, d_sae: int, path: Path) -> torch.nn.Module:
    if kind in ("topk", "batchtopk"):
        k = cfg.get("k")
        if isinstance(k, float) and k.is_integer():
            k = int(k)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= d_sae:
            raise ModelFileError(f"{path / CONFIG}: k must be a whole number from 1 to d_sae ({d_sae}), got {k!r}")
        return TopK(k) if kind == "topk" else BatchTopK(k)
    return JumpReLU(d_sae) if kind == "jumprelu" else ReLU()


def _mlp_out_of(site: str, path: Path) -> str:
    """A transcoder without hook_name_out writes what its block's MLP writes (SAELens's convention)."""
    layer = names.parse(site).layer
    if layer is None:
        raise ModelFileError(f"{path / CONFIG}: a transcoder needs hook_name_out (which site it writes)")
    return names.activation(layer, "mlp_out")


def _load_weights(sae: SAE, file: Path) -> None:
    if not file.is_file():
        raise MissingFileError(f"{file} is missing: a SAELens dictionary holds its weights there")
    try:
        stored = load_file(str(file))
    except (SafetensorError, OSError, ValueError) as e:
        raise ModelFileError(f"{file} is damaged or not a safetensors file ({str(e).splitlines()[0][:120]})") from None
    want = dict(sae.state_dict())
    if "act.threshold" in want:
        want["threshold"] = want.pop("act.threshold")
    missing = sorted(set(want) - set(stored))
    if missing:
        hint = " (a JumpReLU needs its thresholds)" if "threshold" in missing else ""
        raise ModelFileError(f"{file} lacks {', '.join(missing)}{hint}")
    for name, t in want.items():
        got = stored[name]
        if tuple(got.shape) != tuple(t.shape):
            raise ModelFileError(f"{file}: {name} is {tuple(got.shape)}, but cfg.json's sizes need {tuple(t.shape)}")
        if not got.dtype.is_floating_point:
            raise ModelFileError(f"{file}: {name} has dtype {got.dtype}; a dictionary's weights are floating point")
        with torch.no_grad():
            t.copy_(got)
