from lumen.block import SwiGLU  # noqa: F401
