from lumen.block import PostLNBlock  # noqa: F401
