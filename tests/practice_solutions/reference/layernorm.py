from lumen.block import LayerNorm  # noqa: F401
