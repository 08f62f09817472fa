from lumen.block import RMSNorm  # noqa: F401
