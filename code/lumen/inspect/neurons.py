"""MLP neurons as key-value memories (Geva et al. 2021).

Hidden unit i of block l's MLP reads the stream with a key (column i of W1) and, when it fires, writes
its value (row i of W2) into the stream. So a neuron has two faces:
  - its triggers: the contexts in a corpus where it fires hardest (the token it fires on, marked);
  - its effect: the vocabulary tokens its value vector promotes and suppresses, read the way the model
    reads the stream: through the final norm's gain and the unembedding.

    >>> value_tokens(model, tok, layer=20, unit=17)          # doctest: +SKIP
    >>> scan_layer(model, tok, windows, layer=20)[:5]   # the clearest triggers  # doctest: +SKIP

A mixture of experts (Qwen3-MoE) has a hidden layer per expert: give `expert=e` and the units are expert e's
(its value vectors, and its triggers among the tokens the router sends it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from .. import names
from ..block import LayerNorm, MixtureOfExperts, SwiGLU, TransformerBlock
from ..errors import UserError
from ..model import GPT
from ..progress import progress
from ..tokenizers import Batch, Tokenizer
from ..tokenizers.shown import shown
from .cache import capture, check_layer


def _mlp(model: GPT, layer: int, expert: int | None = None) -> torch.nn.Module:
    """Block `layer`'s MLP, or expert `expert` of its mixture of experts (which needs one)."""
    block = model.blocks[check_layer(model, layer)]
    assert isinstance(block, TransformerBlock)  # every GPT block is one (pre-LN, post-LN or parallel)
    moe = block.mlp if isinstance(block.mlp, MixtureOfExperts) else None
    if moe is None:
        if expert is not None:
            raise UserError(f"expert {expert}: block {layer}'s MLP is not a mixture of experts (leave expert out)")
        return block.mlp
    if expert is None or not 0 <= expert < len(moe.experts):
        raise UserError(f"block {layer}'s MLP is a mixture of {len(moe.experts)} experts: give expert=0.."
                        f"{len(moe.experts) - 1}, got {expert}")
    return moe.experts[expert]


def _down(model: GPT, layer: int, expert: int | None = None) -> torch.nn.Linear:
    return _mlp(model, layer, expert).down  # type: ignore[return-value]  # (every MLP's .down is a Linear)


def n_units(model: GPT, layer: int, expert: int | None = None) -> int:
    return _down(model, layer, expert).in_features


def check_unit(model: GPT, layer: int, unit: int, expert: int | None = None) -> int:
    n = n_units(model, layer, expert)
    if not 0 <= unit < n:
        raise UserError(f"unit {unit} is out of range: block {layer}'s MLP has units 0..{n - 1}")
    return unit


@torch.no_grad()
def value_logits(model: GPT, layer: int, units: int | torch.Tensor | None = None,
                 expert: int | None = None) -> torch.Tensor:
    """How each unit's value vector moves the logits: unembedding(gain * value), (V,) for one unit or
    (units, V). LayerNorm also removes the mean, so the value is centred first; the norm's division by
    the stream's size only scales all logits alike and is left out. A sandwich block's post-MLP norm and a
    soft-cap on the logits are left out too: this is the direction a value pushes, before either rescales it.
    expert: which expert's units, in a mixture of experts."""
    values = _down(model, layer, expert).weight.T            # (d_ff, d): row i is unit i's value
    if isinstance(units, int):
        values = values[check_unit(model, layer, units, expert)][None]
    elif units is not None:
        values = values[units]
    out = direction_logits(model, values)
    return out[0] if isinstance(units, int) else out


@torch.no_grad()
def direction_logits(model: GPT, directions: torch.Tensor) -> torch.Tensor:
    """How writing each direction (n, d) into the stream moves the logits: unembedding(gain * direction), (n, V)
    (an MLP unit's value, a sparse dictionary's feature). LayerNorm also removes the mean, so a direction is
    centred first; the norm's division by the stream's size only scales all logits alike and is left out."""
    if isinstance(model.ln_f, LayerNorm):
        directions = directions - directions.mean(-1, keepdim=True)
    gain = getattr(model.ln_f, "gain", None)
    if gain is not None:
        directions = directions * gain
    return directions.to(model.lm_head.weight.dtype) @ model.lm_head.weight.T   # (an unembedding bias moves no logit)


def value_tokens(model: GPT, tokenizer: Tokenizer, layer: int, unit: int, k: int = 10) -> dict:
    """The k tokens unit's value vector promotes most and the k it suppresses most, with their logit shifts."""
    return shifted_tokens(tokenizer, value_logits(model, layer, unit), k)


def shifted_tokens(tokenizer: Tokenizer, z: torch.Tensor, k: int = 10) -> dict:
    """The k tokens a logit shift z (V,) raises most and the k it lowers most, each with its shift."""
    up, down = z.topk(k), (-z).topk(k)
    return {
        "promoted": [(tokenizer.decode([int(i)]), float(v)) for v, i in zip(up.values, up.indices)],
        "suppressed": [(tokenizer.decode([int(i)]), float(-v)) for v, i in zip(down.values, down.indices)],
    }


@torch.no_grad()
def top_activations(
    model: GPT, windows: torch.Tensor | Batch, layer: int, k: int = 10, batch: int = 8,
    mask: torch.Tensor | None = None, expert: int | None = None, site: str | None = None,
    read: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """For every unit of block `layer`'s MLP, its k largest activations over token windows (N, T):
    (values (units, k), flat positions (units, k) into windows.flatten()). Runs the blocks up to `layer` only.
    A padded batch (a Batch, or windows and a mask) counts its real tokens only. expert: in a mixture of experts,
    that expert's units, over the tokens the router sends it (the others never count).
    site, read: any other units, read off a site of block `layer` (e.g. a sparse dictionary's features:
    site="blocks.8.resid_post", read=sae.encode)."""
    if isinstance(windows, Batch):
        mask, windows = windows.mask, windows.ids
    check_layer(model, layer)
    if site is None:
        _mlp(model, layer, expert)  # (a clear error for a missing or needless expert)
    site = site or names.activation(layer, "mlp_hidden")
    best_v: torch.Tensor | None = None
    best_i: torch.Tensor | None = None
    what = f"block {layer}'s MLP" if site == names.activation(layer, "mlp_hidden") else names.display(site)
    for start in progress(range(0, windows.size(0), batch), desc=f"reading {what}", unit="batch"):
        x = windows[start : start + batch].to(model.device)
        m = mask[start : start + batch].to(model.device) if mask is not None else None
        if expert is None:
            a = capture(model, x, site, m)
            acts = a if read is None else read(a)
        else:
            acts = _expert_hidden(model, x, layer, expert, m)
        acts = acts.flatten(0, 1).float().cpu()                               # (B*T, units)
        if m is not None:   # padding never counts as a trigger
            acts = acts.masked_fill(~m.flatten().cpu()[:, None], float("-inf"))
        pos = torch.arange(start * windows.size(1), start * windows.size(1) + acts.size(0))
        kk = min(k, acts.size(0))
        v, i = acts.topk(kk, dim=0)                                    # (kk, units)
        v, i = v.T, pos[i].T                                           # (units, kk)
        if best_v is not None and best_i is not None:
            v, i = torch.cat([best_v, v], 1), torch.cat([best_i, i], 1)
        order = v.topk(min(k, v.size(1)), dim=1).indices
        best_v, best_i = v.gather(1, order), i.gather(1, order)
    if best_v is None or best_i is None:
        raise UserError("no token windows to scan (give a longer corpus)")
    return best_v, best_i


def _expert_hidden(model: GPT, x: torch.Tensor, layer: int, expert: int, mask: torch.Tensor | None) -> torch.Tensor:
    """(B, T, units): expert `expert`'s hidden units at every token the router sends it, -inf at the others. Read off
    the mixture's own input (a forward pre-hook for one pass), so they are the units the expert computes there."""
    moe = model.blocks[layer].mlp
    assert isinstance(moe, MixtureOfExperts)
    seen: list[torch.Tensor] = []
    handle = moe.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    try:
        chosen = capture(model, x, names.activation(layer, "expert_choices"), mask)    # (B, T, k)
    finally:
        handle.remove()
    e = moe.experts[expert]
    assert isinstance(e, SwiGLU)
    h = seen[0]
    hidden = F.silu(e.w_gate(h)) * e.w_up(h)                                           # (B, T, units)
    return hidden.masked_fill(~(chosen == expert).any(-1, keepdim=True), float("-inf"))


@dataclass
class Context:
    activation: float
    before: str       # the text leading up to the trigger
    trigger: str      # the token the unit fired on
    after: str        # the tokens that follow (the first is what the model had to predict)

    def marked(self) -> str:
        """The context with the trigger token marked, on one line: `... before [[trigger]] after`."""
        return shown(f"{self.before}[[{self.trigger}]]{self.after}")


def contexts(tokenizer: Tokenizer, windows: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
             before: int = 12, after: int = 3) -> list[Context]:
    """Text around each flat position (from `top_activations`), within its own window."""
    T = windows.size(1)
    out = []
    for v, p in zip(values.tolist(), positions.tolist()):
        row, t = divmod(p, T)
        ids = windows[row].tolist()
        out.append(Context(v, tokenizer.decode(ids[max(0, t - before) : t]), tokenizer.decode([ids[t]]),
                           tokenizer.decode(ids[t + 1 : t + 1 + after])))
    return out


@dataclass
class NeuronReport:
    layer: int
    unit: int
    top_activation: float
    trigger_share: float        # fraction of the top contexts that fire on the same token
    common_trigger: str
    agreement: float            # fraction of top contexts whose next token is among the promoted tokens
    contexts: list[Context]
    promoted: list[tuple[str, float]]
    suppressed: list[tuple[str, float]]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["contexts"] = [dict(asdict(c), marked=c.marked()) for c in self.contexts]
        return d


def neuron_report(model: GPT, tokenizer: Tokenizer, windows: torch.Tensor, layer: int, unit: int,
                  values: torch.Tensor, positions: torch.Tensor, n_value_tokens: int = 10) -> NeuronReport:
    """Triggers and value tokens of one unit, given its top activations (a row of `top_activations`)."""
    ctx = contexts(tokenizer, windows, values, positions)
    flat = windows.flatten()
    triggers = Counter(int(flat[p]) for p in positions.tolist())
    common, count = triggers.most_common(1)[0]
    vt = value_tokens(model, tokenizer, layer, unit, n_value_tokens)
    promoted_ids = set(value_logits(model, layer, unit).topk(n_value_tokens).indices.tolist())
    nexts = [int(flat[p + 1]) for p in positions.tolist() if (p + 1) % windows.size(1)]
    agree = sum(n in promoted_ids for n in nexts) / max(1, len(nexts))
    return NeuronReport(layer, unit, float(values[0]), count / len(positions), tokenizer.decode([common]), agree,
                        ctx, vt["promoted"], vt["suppressed"])


def scan_layer(model: GPT, tokenizer: Tokenizer, windows: torch.Tensor, layer: int, k: int = 10,
               show: int = 10) -> list[NeuronReport]:
    """Every unit of block `layer` over the windows; the `show` units with the clearest patterns: those whose
    top-k contexts fire on one and the same token most often beyond what that token's frequency in the
    windows would give by chance (a unit that fires on spaces is less telling than one that fires on "king"),
    then those that fire hardest."""
    values, positions = top_activations(model, windows, layer, k)
    flat = windows.flatten()
    trig = flat[positions]                                              # (units, k) trigger token ids
    common = trig.mode(dim=1).values
    share = (trig == common[:, None]).float().mean(1)                   # how often the commonest trigger recurs
    freq = torch.bincount(flat, minlength=int(flat.max()) + 1).float() / flat.numel()
    clarity = share - freq[common]
    order = sorted(range(values.size(0)), key=lambda u: (-round(float(clarity[u]), 6), -float(values[u, 0])))
    return [neuron_report(model, tokenizer, windows, layer, u, values[u], positions[u]) for u in order[:show]]
