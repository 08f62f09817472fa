"""The tuned lens (Belrose et al. 2023): per layer a learned affine translator h -> h + A h + b, trained
so that the translated stream, read through the final norm and unembedding, matches the model's final
output (minimal KL). With A = 0 and b = 0 it is exactly the logit lens, which is where training starts.

    >>> lens = train_tuned_lens(model, batches, steps=100)    # doctest: +SKIP
    >>> lens.save("smollm2.lens.safetensors")                 # doctest: +SKIP
    >>> lens = TunedLens.load("smollm2.lens.safetensors", model)   # doctest: +SKIP

A saved lens carries a hash of the model's read-out (final norm and unembedding), so it is never
applied to a model it was not trained for.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

from ..errors import MissingFileError, ModelFileError, UserError
from ..files import atomic_path
from ..formats.weights import read_safetensors
from ..model import GPT
from ..progress import progress
from .lens import Lens, kl_to_final, streams

KIND = "lumen-tuned-lens"


def unembedding_hash(model: GPT) -> str:
    """sha256 of the final norm's and the unembedding's weights (as float32): the model's read-out."""
    h = hashlib.sha256()
    tensors = list(model.ln_f.state_dict().items()) + [("lm_head.weight", model.lm_head.weight)]
    for name, t in tensors:
        h.update(name.encode())
        h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


class Translator(nn.Module):
    """The affine map A h + b of one layer, written as A' (h / s) + b with a fixed per-dimension scale s
    (the stream's RMS per dimension on the first training batch). The family of maps is the same; the
    scale only preconditions training, so that a few huge stream dimensions (the "massive activations"
    of Llama-style models) do not make every optimiser step on their column a thousand times larger."""

    scale: torch.Tensor

    def __init__(self, d: int, device=None, dtype=None):
        super().__init__()
        self.lin = nn.Linear(d, d, device=device, dtype=dtype)
        nn.init.zeros_(self.lin.weight)   # A = 0, b = 0: an untrained tuned lens is the logit lens
        nn.init.zeros_(self.lin.bias)
        self.register_buffer("scale", torch.ones(d, device=device, dtype=dtype))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.lin(h / self.scale)


class TunedLens(Lens):
    """The logit lens plus one affine translator per layer below the last; the last layer's stream is
    read exactly as the model reads it."""

    def __init__(self, model: GPT):
        super().__init__(model)
        d = model.cfg.d_model
        w = model.lm_head.weight
        self.translators = nn.ModuleList(Translator(d, w.device, w.dtype) for _ in range(self.n_layers))
        self.model_hash = unembedding_hash(model)

    def translate(self, h: torch.Tensor, layer: int) -> torch.Tensor:
        if layer >= self.n_layers:
            return h
        return h + self.translators[layer](h)     # a correction on top of the stream, as a residual

    def save(self, path: str | Path) -> Path:
        """Write the translators and the model's read-out hash to one safetensors file, atomically."""
        meta = {"kind": KIND, "unembedding_sha256": self.model_hash, "n_layers": str(self.n_layers),
                "d_model": str(self.model.cfg.d_model),
                "model": self.model.cfg.name}
        state = {k: v.detach().cpu().contiguous() for k, v in self.translators.state_dict().items()}
        with atomic_path(path) as tmp:
            save_file(state, str(tmp), metadata=meta)
        return Path(path)

    @classmethod
    def load(cls, path: str | Path, model: GPT) -> TunedLens:
        """A saved lens, attached to `model`; a clear error if it was trained for another model or the file
        is damaged (wrong names, shapes or types, NaN)."""
        path = Path(path)
        if not path.is_file():
            raise MissingFileError(f"no tuned lens at {path} (train one with `lumen tuned-lens train MODEL`)")
        state = read_safetensors(path)  # (a damaged file is a ModelFileError naming it)
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        if meta.get("kind") != KIND:
            raise ModelFileError(f"{path} is not a tuned lens saved by lumen (metadata kind {meta.get('kind')!r})")
        lens = cls(model)
        if meta.get("unembedding_sha256") != lens.model_hash:
            raise UserError(
                f"{path} was trained for another model ({meta.get('model')}, {meta.get('n_layers')} layers): its "
                "unembedding hash does not match this model's (train a lens for this model with "
                "`lumen tuned-lens train MODEL --corpus ...`)"
            )
        if meta.get("n_layers") != str(lens.n_layers):
            raise ModelFileError(
                f"{path} has {meta.get('n_layers')} translators; this model has {lens.n_layers} layers"
            )
        want = lens.translators.state_dict()
        if set(state) != set(want):
            raise ModelFileError(f"{path} holds tensors {sorted(set(state) ^ set(want))[:3]} that do not fit this "
                                 f"model's {lens.n_layers} translators; the file is damaged (train the lens again)")
        for name, t in state.items():
            if not t.is_floating_point() or t.shape != want[name].shape or not torch.isfinite(t).all():
                raise ModelFileError(f"{path}: tensor {name} ({t.dtype}, {tuple(t.shape)}) is not a finite float "
                                     f"tensor of shape {tuple(want[name].shape)}; the file is damaged")
        lens.translators.load_state_dict({k: v.to(model.lm_head.weight) for k, v in state.items()})
        return lens


def train_tuned_lens(
    model: GPT,
    batches: Iterable[torch.Tensor],
    steps: int,
    lr: float = 3e-3,
    lens: TunedLens | None = None,
    log: Callable[[int, float], None] | None = None,
) -> TunedLens:
    """Train a tuned lens for `steps` batches of token ids (B, T) drawn from `batches`, minimising the
    sum over layers of KL(final output || lens at that layer). The model itself is not changed.

    Adam, with the learning rate falling linearly to 0, on translators whose inputs are scaled per dimension
    (see Translator); the layers are backpropagated one at a time so that
    only one layer's logits (B*T x vocab) are held at once. log(step, mean KL per layer) reports progress,
    after each step's update. The translators are trained in place: pass `lens` in to keep what the finished
    steps trained when the loop is interrupted (a KeyboardInterrupt passes through, the model restored).
    """
    if steps < 1:
        raise UserError(f"steps must be at least 1, got {steps}")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise UserError(f"lr must be a finite number above 0, got {lr}")
    lens = lens if lens is not None else TunedLens(model)
    opt = torch.optim.Adam(lens.translators.parameters(), lr=lr)
    fresh = all(not t.get_parameter("lin.weight").detach().any() for t in lens.translators)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 - s / steps)
    frozen = [(p, p.requires_grad) for p in model.parameters()]
    was_training = model.training
    model.eval()
    bar = progress(total=steps, desc="training the tuned lens", unit="step")
    try:
        for p, _ in frozen:
            p.requires_grad_(False)   # gradients flow through the read-out to the translators only
        it = iter(batches)
        for step in range(steps):
            try:
                idx = next(it)
            except StopIteration:
                raise UserError(
                    f"the corpus ran out after {step} of {steps} steps (give more text or fewer steps)"
                ) from None
            with torch.no_grad():
                logits, hs = streams(model, idx)
                final_logp = F.log_softmax(logits.float(), -1)
                if step == 0 and fresh:   # the per-dimension scale of each layer's stream, set once
                    for t, h in zip(lens.translators, hs):
                        t.get_buffer("scale").copy_(h.flatten(0, -2).pow(2).mean(0).sqrt().clamp_min(1e-6))
            opt.zero_grad(set_to_none=True)
            total = 0.0
            for layer in range(lens.n_layers):
                logp = F.log_softmax(lens(hs[layer], layer).float(), -1)
                loss = kl_to_final(final_logp, logp).mean()
                loss.backward()
                total += float(loss.detach())
            opt.step()
            sched.step()
            bar.update()
            bar.set_postfix(kl=f"{total / max(1, lens.n_layers):.3f}")
            if log is not None:
                log(step, total / max(1, lens.n_layers))
    finally:
        bar.close()   # however the loop ends (a Ctrl-C included)
        for p, req in frozen:
            p.requires_grad_(req)
        model.train(was_training)
    return lens
