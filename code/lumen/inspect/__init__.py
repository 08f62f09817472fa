"""Looking inside a model: the named activation cache, logit and tuned lens, layer deletion, MLP neurons
as key-value memories, and attention-head scores. Everything works on a lumen GPT through forward hooks
and leaves the model's arithmetic alone."""

from .ablate import deletion_table, heldout_loss
from .cache import (
    ActivationCache,
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
]
