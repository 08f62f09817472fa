"""Experiment `logit-lens`: read the stream after every layer through the final norm and unembedding, on
SmolLM2 and on a small trained lumen model, and check the chapter's story: early layers surface form,
middle layers plausible guesses, late layers the answer. At which layer does the final answer first
become top-1?"""

from __future__ import annotations

from typing import TypedDict

import torch

from ..inspect import logit_lens
from ..inspect.corpus import token_windows
from ..tokenizers.shown import quoted
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


class Size(TypedDict):
    prompts: int   # SmolLM2 prompts read (the first of PROMPTS)
    windows: int   # Shakespeare windows the small trained model reads
    seq_len: int   # of this many tokens (at most its context)


SIZES = {False: Size(prompts=len(PROMPTS), windows=8, seq_len=128), True: Size(prompts=4, windows=2, seq_len=48)}


def settled(top1: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
    """Per position, the first layer from which the lens's top-1 is the final top-1 at every later layer.
    top1: (layers, T), final: (T,)."""
    match = top1 == final
    stays = match.flip(0).cumprod(0).flip(0)          # 1 where it matches here and at every later layer
    return stays.size(0) - stays.sum(0)


def first(top1: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
    """Per position, the first layer whose top-1 is the final top-1."""
    return (top1 == final).float().argmax(0)


def measure(size: Size, seed: int, quick: bool = False) -> dict:
    """The lens at the last position of each SmolLM2 prompt, and at every position of the small trained model's
    windows: where the final top-1 first appears and settles, and how often a layer's top-1 is the input token."""
    s = size
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
        rows.append([prompt, quoted(said), "yes" if said == expected else f"no ({quoted(expected)})", f, st,
                     quoted(middle[-1]), quoted(r.top_tokens(1)[-1])])
    per_layer_answer /= len(prompts)
    per_layer_copy /= len(prompts)

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
    c_answer /= len(windows)
    c_copy /= len(windows)
    return {"smollm2": {"rows": rows, "mean_first_layer": sum(first_layers) / len(first_layers),
                        "mean_settled_layer": sum(settled_layers) / len(settled_layers), "n_layers": n,
                        "answer_top1_by_layer": per_layer_answer.tolist(),
                        "input_top1_by_layer": per_layer_copy.tolist(),
                        "middle_filler_fraction": sum(map(is_filler, middle)) / len(middle)},
            "trained": {"mean_first_layer": float(torch.cat(first_parts).mean()),
                        "mean_settled_layer": float(torch.cat(settled_parts).mean()), "n_layers": cn,
                        "answer_top1_by_layer": c_answer.tolist(), "input_top1_by_layer": c_copy.tolist()}}


def tables(n: dict, s: Size) -> list[Table]:
    big, small = n["smollm2"], n["trained"]
    L, cn = big["n_layers"], small["n_layers"]
    t1 = Table(f"SmolLM2-135M ({L} layers): the last position of each prompt",
               ["prompt", "model says", "expected?", "first layer top-1", "settled from layer",
                f"top-1 at layer {L // 2}", "top-1 at layer 1"], big["rows"])
    t2 = Table("When the final top-1 first appears (mean over positions / prompts; layer 0 = the embedding)",
               ["model", "layers", "first top-1 layer", "settled from layer", "as a fraction of depth",
                "top-1 = input token at layer 0", "... at the middle layer"],
               [["SmolLM2-135M", L, big["mean_first_layer"], big["mean_settled_layer"], big["mean_settled_layer"] / L,
                 big["input_top1_by_layer"][0], big["input_top1_by_layer"][L // 2]],
                ["trained lumen (chars)", cn, small["mean_first_layer"], small["mean_settled_layer"],
                 small["mean_settled_layer"] / cn, small["input_top1_by_layer"][0],
                 small["input_top1_by_layer"][cn // 2]]])
    return [t1, t2]


def verdict(n: dict, s: Size) -> str:
    big, small = n["smollm2"], n["trained"]
    L, mean_settled = big["n_layers"], big["mean_settled_layer"]
    return (f"On SmolLM2 the final answer becomes the lens's top-1 on average at layer {big['mean_first_layer']:.1f} "
            f"and stays from layer {mean_settled:.1f} of {L} ({mean_settled / L:.0%} of the depth)"
            + (": only the last few layers converge on it, as the chapter says (at the middle layer "
               f"{big['middle_filler_fraction']:.0%} of the prompts' top-1 tokens are spaces, punctuation or function "
               "words rather than plausible answers; Belrose et al. (2023) found the logit lens reads models other "
               "than GPT-2 poorly before the last layers and proposed the tuned lens)"
               if mean_settled / L > 0.8 else ", earlier than the chapter's story suggests")
            + f". Early layers echo the surface form: at layer 0 the top-1 is the input token itself for "
            f"{big['input_top1_by_layer'][0]:.0%} of prompts. On the small trained model the prediction settles at "
            f"{small['mean_settled_layer'] / small['n_layers']:.0%} of its {small['n_layers']}-layer depth on average.")


def draw(n: dict, s: Size):
    """Per layer, how often the top-1 is the final answer and how often the input token, both models."""
    fig, (ax1, ax2) = figure(2, 5.5, 4)
    for ax, m, what, title in ((ax1, n["smollm2"], "prompts", "SmolLM2-135M, logit lens"),
                               (ax2, n["trained"], "positions", "trained lumen model (characters)")):
        ax.plot(range(m["n_layers"] + 1), m["answer_top1_by_layer"], "o-", label="top-1 = final answer")
        ax.plot(range(m["n_layers"] + 1), m["input_top1_by_layer"], "s-", label="top-1 = input token")
        ax.set(xlabel="layer", ylabel=f"fraction of {what}", title=title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def run(quick: bool, seed: int) -> Result:
    size = SIZES[quick]
    n = measure(size, seed, quick)
    return Result(NAME, CLAIM, tables(n, size), verdict(n, size), n, {"logit-lens": draw(n, size)},
                  [f"The trained model is {describe_trained(quick, seed)}."])
