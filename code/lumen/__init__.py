"""lumen: a transformer language-model library to read line by line, train, load and look inside."""

from .attention import KVCache, MultiHeadAttention, RoPE
from .block import MLP, LayerNorm, PostLNBlock, RMSNorm, SwiGLU, TransformerBlock
from .config import PRESETS, ModelConfig
from .model import GPT

__version__ = "0.1.0"

__all__ = [
    "GPT", "KVCache", "LayerNorm", "MLP", "ModelConfig", "MultiHeadAttention", "PRESETS",
    "PostLNBlock", "RMSNorm", "RoPE", "SwiGLU", "TransformerBlock",
]
