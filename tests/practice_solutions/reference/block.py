from lumen.block import TransformerBlock  # noqa: F401
