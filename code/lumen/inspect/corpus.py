"""Token windows for the looking-inside tools: random passages of a corpus, encoded with the model's
own tokenizer. Reads the corpus through lumen.data (same documents, same held-out works as training),
but encodes only the passages it needs, so a pretrained model's tokenizer costs nothing up front.

    >>> batch = token_windows(tok, "shakespeare", "val", n=8, seq_len=128)   # doctest: +SKIP
    >>> batch.shape                                          # doctest: +SKIP
    torch.Size([8, 128])
"""

from __future__ import annotations

import random

import torch

from ..data import SHAKESPEARE_VALIDATION, read_corpus, split_documents
from ..errors import UserError
from ..tokenizers import Tokenizer

SPLITS = ("train", "val")
MAX_TOKENS = 2**24  # the most tokens one call reads (128 MiB of ids; hours of forward passes on a CPU)


def token_windows(
    tokenizer: Tokenizer, corpus: str = "shakespeare", split: str = "val", n: int = 8, seq_len: int = 128,
    seed: int = 0,
) -> torch.Tensor:
    """n windows of seq_len token ids (n, seq_len), each starting at a line start of a random passage of
    the split's documents (chosen in proportion to their length); deterministic for a seed."""
    if split not in SPLITS:
        raise UserError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if n < 1 or seq_len < 2:
        raise UserError(f"need at least one window of at least 2 tokens (got n={n}, seq_len={seq_len})")
    if n * seq_len > MAX_TOKENS:
        raise UserError(f"{n:,} windows of {seq_len:,} tokens are more than lumen reads at once ({MAX_TOKENS:,} "
                        "tokens): ask for fewer")
    docs = read_corpus(corpus)
    train, val = split_documents(docs, SHAKESPEARE_VALIDATION if corpus == "shakespeare" else None)
    docs = train if split == "train" else val
    rng = random.Random(seed)
    weights = [len(d.text) for d in docs]
    windows: list[list[int]] = []
    chars = 8 * seq_len
    for _ in range(100 * n):  # a passage that is too short is drawn again; a corpus where all are gives up
        text = rng.choices(docs, weights)[0].text
        start = rng.randrange(max(1, len(text) - chars))
        line = text.find("\n", start, start + chars // 2) + 1   # begin at a line start, when one is near
        ids = tokenizer.encode(text[line or start:][:chars])
        if len(ids) >= seq_len:
            windows.append(ids[:seq_len])
            if len(windows) == n:
                return torch.tensor(windows, dtype=torch.long)
    raise UserError(
        f"corpus {corpus!r} ({split}) is too short for windows of {seq_len} tokens (use a lower --seq-len)"
    )
