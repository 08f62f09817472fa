"""Experiment `logit-lens`: read the stream after every layer through the final norm and unembedding, on
SmolLM2 and on a small trained lumen model, and check the chapter's story: early layers surface form,
middle layers plausible guesses, late layers the answer. At which layer does the final answer first
become top-1?"""

from __future__ import annotations

from typing import Any

import torch

from ..inspect import logit_lens
from ..inspect.corpus import token_windows
from .result import Result, Table, figure
from .subjects import describe_trained, smollm2, trained_char_model

NAME = "logit-lens"
CLAIM = ("Through the logit lens, early layers predict near-nonsense (surface form), middle layers plausible word "
         "classes, and the last few layers converge on the actual output: the stream gradually becomes the "
         "prediction.")

# prompt -> the answer a reader expects (the table shows what the model actually says)
PROMPTS = {
    "The capital of France is": " Paris",
    "Monday, Tuesday, Wednesday,": " Thursday",
    "One, two, three, four,": " five",
    "Romeo and": " Juliet",
    "The opposite of hot is": " cold",
    "January, February, March,": " April",
    "The largest planet in the solar system is": " Jupiter",
    "The chemical symbol for gold is": " Au",
    "To be or not to be, that is the": " question",
    "The sun rises in the": " east",
    "The Eiffel Tower is in the city of": " Paris",
    "Water is made of hydrogen and": " oxygen",
}
FUNCTION_WORDS = {"the", "a", "an", "and", "or", "of", "to", "in", "on", "is", "it", "i", "my", "you", "that", "this"}


def is_filler(token: str) -> bool:
    """A space, punctuation or a function word: a token that says nothing about the answer."""
    t = token.strip().lower()
    return not any(c.isalnum() for c in t) or t in FUNCTION_WORDS


SIZES: dict[bool, dict[str, Any]] = {False: dict(prompts=len(PROMPTS), windows=8, seq_len=128),
                                     True: dict(prompts=4, windows=2, seq_len=48)}


def settled(top1: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
    """Per position, the first layer from which the lens's top-1 is the final top-1 at every later layer.
    top1: (layers, T), final: (T,)."""
    match = top1 == final
    stays = match.flip(0).cumprod(0).flip(0)          # 1 where it matches here and at every later layer
    return stays.size(0) - stays.sum(0)


def first(top1: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
    """Per position, the first layer whose top-1 is the final top-1."""
    return (top1 == final).float().argmax(0)


def run(quick: bool, seed: int) -> Result:
    s = SIZES[quick]
    model, tok = smollm2()
    n = len(model.blocks)
    rows, per_layer_answer, per_layer_copy = [], torch.zeros(n + 1), torch.zeros(n + 1)
    prompts = dict(list(PROMPTS.items())[: s["prompts"]])
    first_layers, settled_layers, middle = [], [], []
    for prompt, expected in prompts.items():
        ids = tok.encode(prompt)
        r = logit_lens(model, ids, tokenizer=tok, k=1)
        top1 = r.top_ids[:, -1, 0]                                  # (layers + 1,) at the last position
        answer = int(top1[-1])
        f, st = int(first(top1[:, None], top1[-1:])[0]), int(settled(top1[:, None], top1[-1:])[0])
        first_layers.append(f)
        settled_layers.append(st)
        per_layer_answer += (top1 == answer).float()
        per_layer_copy += (top1 == ids[-1]).float()
        said = tok.decode([answer])
        middle.append(r.top_tokens(n // 2)[-1])
        rows.append([prompt, repr(said), "yes" if said == expected else f"no ({expected!r})", f, st,
                     repr(middle[-1]), repr(r.top_tokens(1)[-1])])
    filler = sum(map(is_filler, middle)) / len(middle)
    per_layer_answer /= len(prompts)
    per_layer_copy /= len(prompts)
    t1 = Table(f"SmolLM2-135M ({n} layers): the last position of each prompt",
               ["prompt", "model says", "expected?", "first layer top-1", "settled from layer",
                f"top-1 at layer {n // 2}", "top-1 at layer 1"], rows)

    cm, ctok, _ = trained_char_model(quick, seed)
    windows = token_windows(ctok, "shakespeare", "val", n=s["windows"], seq_len=min(s["seq_len"], cm.cfg.context),
                            seed=seed)
    cn = len(cm.blocks)
    first_parts, settled_parts, c_answer, c_copy = [], [], torch.zeros(cn + 1), torch.zeros(cn + 1)
    for w in windows:
        r = logit_lens(cm, w, k=1)
        top1 = r.top_ids[..., 0]                                   # (layers + 1, T)
        first_parts.append(first(top1, top1[-1]).float())
        settled_parts.append(settled(top1, top1[-1]).float())
        c_answer += (top1 == top1[-1]).float().mean(1)
        c_copy += (top1 == w).float().mean(1)
    c_first, c_settled = torch.cat(first_parts), torch.cat(settled_parts)
    c_answer /= len(windows)
    c_copy /= len(windows)
    mean_first = sum(first_layers) / len(first_layers)
    mean_settled = sum(settled_layers) / len(settled_layers)
    t2 = Table("When the final top-1 first appears (mean over positions / prompts; layer 0 = the embedding)",
               ["model", "layers", "first top-1 layer", "settled from layer", "as a fraction of depth",
                "top-1 = input token at layer 0", "... at the middle layer"],
               [["SmolLM2-135M", n, mean_first, mean_settled, mean_settled / n, float(per_layer_copy[0]),
                 float(per_layer_copy[n // 2])],
                ["trained lumen (chars)", cn, float(c_first.mean()), float(c_settled.mean()),
                 float(c_settled.mean()) / cn, float(c_copy[0]), float(c_copy[cn // 2])]])
    verdict = (f"On SmolLM2 the final answer becomes the lens's top-1 on average at layer {mean_first:.1f} and stays "
               f"from layer {mean_settled:.1f} of {n} ({mean_settled / n:.0%} of the depth)"
               + (": only the last few layers converge on it, as the chapter says (at the middle layer "
                  f"{filler:.0%} of the prompts' top-1 tokens are spaces, punctuation or function words rather than "
                  "plausible answers; Belrose et al. (2023) found the logit lens reads models other than GPT-2 "
                  "poorly before the last layers and proposed the tuned lens)"
                  if mean_settled / n > 0.8 else ", earlier than the chapter's story suggests")
               + f". Early layers echo the surface form: at layer 0 the top-1 is the input token itself for "
               f"{per_layer_copy[0]:.0%} of prompts. On the small trained model the prediction settles at "
               f"{float(c_settled.mean()) / cn:.0%} of its {cn}-layer depth on average.")
    fig, (ax1, ax2) = figure(2, 5.5, 4)
    ax1.plot(range(n + 1), per_layer_answer.tolist(), "o-", label="top-1 = final answer")
    ax1.plot(range(n + 1), per_layer_copy.tolist(), "s-", label="top-1 = input token")
    ax1.set(xlabel="layer", ylabel="fraction of prompts", title="SmolLM2-135M, logit lens")
    ax2.plot(range(cn + 1), c_answer.tolist(), "o-", label="top-1 = final answer")
    ax2.plot(range(cn + 1), c_copy.tolist(), "s-", label="top-1 = input token")
    ax2.set(xlabel="layer", ylabel="fraction of positions", title="trained lumen model (characters)")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    numbers = {"smollm2": {"rows": rows, "mean_first_layer": mean_first, "mean_settled_layer": mean_settled,
                           "n_layers": n, "answer_top1_by_layer": per_layer_answer.tolist(),
                           "input_top1_by_layer": per_layer_copy.tolist(), "middle_filler_fraction": filler},
               "trained": {"mean_first_layer": float(c_first.mean()), "mean_settled_layer": float(c_settled.mean()),
                           "n_layers": cn, "answer_top1_by_layer": c_answer.tolist(),
                           "input_top1_by_layer": c_copy.tolist()}}
    return Result(NAME, CLAIM, [t1, t2], verdict, numbers, {"logit-lens": fig},
                  [f"The trained model is {describe_trained(quick, seed)}."])
