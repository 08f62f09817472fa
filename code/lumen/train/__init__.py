"""Training: the loop (loop.py), its config, the run directory and checkpoints (rundir.py), the machine's
settings (machine.py), the optimizer and schedule, and torch.distributed.

    >>> from lumen.train import TrainConfig, load_config, train
    >>> cfg, model_cfg = load_config(preset="shakespeare", sets=["steps=300", "save=false"])
    >>> cfg.steps, cfg.save, model_cfg.n_layers
    (300, False, 4)
    >>> result = train(cfg, model_cfg)            # doctest: +SKIP
    >>> result.final_val_loss, result.tokens_per_s  # doctest: +SKIP
"""

from .config import PRESETS, TrainConfig, load_config, to_toml
from .loop import TrainingError, TrainingInterrupted, TrainResult, train

__all__ = ["PRESETS", "TrainConfig", "TrainResult", "TrainingError", "TrainingInterrupted", "load_config", "to_toml",
           "train"]
