"""lumen's one error family.

Everything lumen refuses because of what it was given (an argument, a config, a file, a corpus) is a
`LumenError` whose message is one line: what was given (the file, key or argument), what is wrong with it,
and what to do. The `lumen` command prints these as `lumen CMD: error: ...` and exits with 2; any other
exception is a bug in lumen and is shown with its traceback.

The subclasses let callers tell the cases apart; each also derives from the built-in exception a Python
user would expect (`ValueError` for a bad value, `FileNotFoundError` for a missing path), so
`except ValueError` keeps working.

    >>> from lumen.errors import ConfigError, LumenError
    >>> issubclass(ConfigError, LumenError) and issubclass(ConfigError, ValueError)
    True
"""

from __future__ import annotations


class LumenError(Exception):
    """Something lumen was given is wrong; the message says what, where, and what to do."""


class UserError(LumenError, ValueError):
    """A bad argument or setting, from the command line or the Python API."""


class ConfigError(UserError):
    """A model or training config (TOML, config.json, ModelConfig fields) that is invalid."""


class CorpusError(UserError):
    """Text to train or evaluate on that cannot be used (missing, empty, not UTF-8, too short)."""


class MissingFileError(LumenError, FileNotFoundError):
    """A file or directory that is not there."""


class ModelFileError(LumenError, ValueError):
    """A model file that is damaged or disagrees with itself (GGUF, safetensors, HF directory, tokenizer)."""


class CheckpointError(ModelFileError):
    """A run or checkpoint directory that is damaged, incomplete, or belongs to another model."""


class FetchError(LumenError, RuntimeError):
    """An artifact that could not be downloaded or failed its checksum."""


class TrainingError(LumenError, RuntimeError):
    """A training run that cannot go on (a NaN loss, a diverging run)."""

