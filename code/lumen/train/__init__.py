"""Training: the loop, its config, the optimizer and schedule, checkpoints and torch.distributed.

    >>> from lumen.train import TrainConfig, load_config, train
    >>> cfg, model_cfg = load_config(preset="shakespeare", sets=["steps=300", "save=false"])
    >>> cfg.steps, cfg.save, model_cfg.n_layers
    (300, False, 4)
    >>> result = train(cfg, model_cfg)            # doctest: +SKIP
    >>> result.final_val_loss, result.tokens_per_s  # doctest: +SKIP
"""

from .config import PRESETS, TrainConfig, load_config, to_toml
from .loop import TrainingError, TrainResult, train

__all__ = ["PRESETS", "TrainConfig", "TrainResult", "TrainingError", "load_config", "to_toml", "train"]
