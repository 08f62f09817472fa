"""Features, not only neurons: sparse dictionaries (SAEs and transcoders) on lumen's named sites.

    >>> from lumen.features import SAE, TopK, read_saelens, save_saelens, spliced
    >>> sae = SAE(384, 3072, TopK(32), site="blocks.2.resid_post")   # or read_saelens("a SAELens folder")
    >>> with spliced(model, sae, error=True) as seen:                # doctest: +SKIP
    ...     logits, _ = model(idx)                                   # the model's own logits ...
    >>> seen["blocks.2.resid_post.features"]         # ... and the features behind them  # doctest: +SKIP

Where things are: dictionary.py (SAE, Transcoder and their activations: ReLU, TopK, BatchTopK, JumpReLU),
saelens.py (SAELens's cfg.json + sae_weights.safetensors, both ways), splice.py (a dictionary in the forward
pass through lumen's hooks; its features as named sites), tools.py (a feature's logits and logit lens, its top
contexts with the activation on every token, its density, attribution patching and exact patching of features),
quality.py (how good a dictionary is), study.py (docs/features.md: features against the MLP's units).
"""

from .dictionary import SAE, BatchTopK, JumpReLU, ReLU, TopK, Transcoder
from .saelens import hook_from_site, read_saelens, save_saelens, site_from_hook
from .splice import run_with_cache, spliced
from .tools import (
    FeatureContext,
    density,
    feature_attribution,
    feature_lens,
    feature_logits,
    patch_feature,
    scan,
    top_contexts,
)

__all__ = ["SAE", "BatchTopK", "FeatureContext", "JumpReLU", "ReLU", "TopK", "Transcoder", "density",
           "feature_attribution", "feature_lens", "feature_logits", "hook_from_site", "patch_feature", "read_saelens",
           "run_with_cache", "save_saelens", "scan", "site_from_hook", "spliced", "top_contexts"]
