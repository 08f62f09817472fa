"""Looking inside a model: the named activation cache, logit and tuned lens, layer deletion, MLP neurons
as key-value memories, and attention-head scores. Everything works on a lumen GPT through forward hooks
and leaves the model's arithmetic alone.

    >>> import torch
    >>> from lumen import GPT
    >>> model = GPT.from_preset("baby-gpt", n_layers=2)        # or lumen.formats.load("smollm2").model
    >>> idx = torch.tensor([[20, 43, 50, 50, 53]])
    >>> logits, cache = model.run_with_cache(idx)              # every named activation: activation_names(model)
    >>> cache.streams().shape                                  # the stream after 0, 1, 2 blocks: (3, B, T, d)
    torch.Size([3, 1, 5, 384])
    >>> logit_lens(model, idx).top_ids.shape                   # top-5 next tokens read after every layer
    torch.Size([3, 5, 5])
    >>> with delete_blocks(model, [0]):                        # the model without block 0, for a while
    ...     logits_without, _ = model(idx)

Where things are: cache.py (run_with_cache, capture, hooks, delete_blocks, replace_activation),
lens.py (logit_lens, LogitLens, evaluate_lens), tuned_lens.py (TunedLens, train_tuned_lens),
ablate.py (layer deletion on held-out text), neurons.py (MLP units), heads.py (attention-head scores).
"""

from .ablate import deletion_table, heldout_loss
from .cache import (
    ActivationCache,
    UnknownActivation,
    activation_names,
    capture,
    delete_blocks,
    hooks,
    replace_activation,
    run_with_cache,
)
from .heads import head_scores, induction_scores, positional_scores
from .lens import Lens, LensResult, LogitLens, evaluate_lens, logit_lens
from .neurons import scan_layer, top_activations, value_logits, value_tokens
from .tuned_lens import TunedLens, train_tuned_lens, unembedding_hash

__all__ = [
    "ActivationCache", "Lens", "LensResult", "LogitLens", "TunedLens", "activation_names", "capture",
    "delete_blocks", "deletion_table", "evaluate_lens", "head_scores", "heldout_loss", "hooks",
    "induction_scores", "logit_lens", "positional_scores", "replace_activation", "run_with_cache",
    "scan_layer", "top_activations", "train_tuned_lens", "unembedding_hash", "value_logits", "value_tokens",
    "UnknownActivation",
]
