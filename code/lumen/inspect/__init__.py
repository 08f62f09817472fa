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

Where things are: hooks.py (run_with_hooks, hooked: the one hook mechanism), cache.py (run_with_cache,
capture, delete_blocks, replace_activation), readout.py (Readout: the final norm and unembedding), stack.py
(decompose, accumulated: the residual stream as a stack), lens.py (logit_lens, LogitLens, evaluate_lens),
tuned_lens.py (TunedLens, train_tuned_lens), attribution.py (direct logit attribution), patching.py
(activation patching), attribution_patching.py, path_patching.py, datasets.py (a file of prompts, lumen.prompts,
through the lens, attribution and patching: LensSet, AttributionSet, PatchingSet), ablate.py (layer deletion on held-out
text), neurons.py (MLP units), heads.py (attention-head scores), weights.py (head_weights: W_Q ... W_O per
head). Every tool that reads prompts takes a padded `lumen.tokenizers.Batch` too.
"""

from .ablate import deletion_table, heldout_loss
from .attribution import Attribution, attribute, top_components
from .attribution_patching import agreement, attribution_patching
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
from .datasets import AttributionSet, LensSet, attribute_prompts, lens_prompts, patch_prompts
from .heads import head_scores, induction_scores, positional_scores
from .hooks import hooked, run_with_hooks
from .lens import Lens, LensResult, LogitLens, evaluate_lens, logit_lens
from .neurons import scan_layer, top_activations, value_logits, value_tokens
from .patching import Patching, PatchingSet, Site, logit_diff, logprob, patch, patching_maps
from .path_patching import path_patching
from .readout import Readout
from .stack import Stack, accumulated, decompose
from .tuned_lens import TunedLens, train_tuned_lens, unembedding_hash
from .weights import HeadWeights, head_weights

__all__ = [
    "ActivationCache", "Attribution", "AttributionSet", "HeadWeights", "LensSet", "attribute_prompts",
    "lens_prompts", "patch_prompts", "Lens", "LensResult", "LogitLens", "Patching", "PatchingSet",
    "Readout", "Site", "Stack", "TunedLens", "accumulated", "activation_names", "attribute", "attribution_patching",
    "capture", "decompose", "delete_blocks", "deletion_table", "evaluate_lens", "head_scores", "head_weights",
    "heldout_loss", "hooked", "hooks", "induction_scores", "logit_diff", "logit_lens", "logprob", "patch",
    "patching_maps", "path_patching", "positional_scores", "replace_activation", "run_with_cache",
    "run_with_hooks", "scan_layer", "top_activations", "top_components", "train_tuned_lens", "unembedding_hash",
    "value_logits", "value_tokens", "UnknownActivation", "agreement",
]
