"""A model's chat template: Jinja code from a model file, compiled when the tokenizer is read and rendered in a
bounded sandbox (no template can hang, build gigabytes or compute huge powers)."""

from __future__ import annotations

import re
import sys

from ..errors import ModelFileError, UserError


class ChatTemplate:
    """A model's chat template: Jinja, compiled when the tokenizer is read (a template that is not valid Jinja is
    refused then, naming its line) and rendered in Jinja's immutable sandbox with bounds, since it is code from a
    model file: at most MAX_CHAT_STEPS lines of template run per render (nested loops cannot hang), no string or
    list repeated, padded or formatted past MAX_CHAT_CHARS, no power past MAX_CHAT_EXPONENT. `raise_exception`
    (Hugging Face's helper) is there for templates that refuse a conversation.

        >>> ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}").render("hi")
        '<user>hi'
    """

    def __init__(self, source: str):
        from jinja2 import TemplateSyntaxError

        self.source = source
        try:
            self.template = _chat_environment().from_string(source)
        except TemplateSyntaxError as e:
            raise ModelFileError(f"the chat template is not valid Jinja (line {e.lineno}: {e.message}); "
                                 "use a model file with a working template, or drop --chat") from None

    def render(self, user_text: str, add_generation_prompt: bool = True) -> str:
        """The template applied to one user message, ready for the model's reply."""
        from jinja2 import TemplateError

        steps = 0

        def count(frame, event, arg):  # every line the template's own code runs counts one step
            nonlocal steps
            if event == "line":
                steps += 1
                if steps > MAX_CHAT_STEPS:
                    raise _ChatBound(f"it ran more than {MAX_CHAT_STEPS:,} steps")
            return count

        def on_call(frame, event, arg):
            return count if frame.f_code.co_filename == "<template>" else None

        before = sys.gettrace()
        sys.settrace(on_call)
        try:
            text = self.template.render(messages=[{"role": "user", "content": user_text}],
                                        add_generation_prompt=add_generation_prompt)
        except _ChatRefusal as e:
            raise UserError(f"the model's chat template refuses this prompt: {e}") from None
        except _ChatBound as e:
            raise ModelFileError(f"the model's chat template asks for too much ({e}); drop --chat and write the "
                                 "prompt yourself") from None
        except (TemplateError, ArithmeticError, LookupError, TypeError, ValueError, RecursionError,
                MemoryError) as e:  # a template is code from the model file: whatever fails in it is the file's
            raise ModelFileError(f"the model's chat template failed ({type(e).__name__}: {_one_line(e)}); "
                                 "drop --chat and write the prompt yourself") from None
        finally:
            sys.settrace(before)
        if len(text) > MAX_CHAT_CHARS:
            raise ModelFileError(f"the model's chat template made {len(text):,} characters of prompt from "
                                 f"{len(user_text):,}; drop --chat and write the prompt yourself")
        return text


MAX_CHAT_STEPS = 1_000_000    # lines of template code one render may run (SmolLM2's runs a few dozen)
MAX_CHAT_CHARS = 1_000_000    # the longest string or list a template may build
MAX_CHAT_EXPONENT = 1024      # the largest power a template may compute


class _ChatBound(Exception):
    """A chat template went past one of ChatTemplate's bounds."""


class _ChatRefusal(Exception):
    """A chat template called raise_exception."""


def _one_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:160]


def _chat_environment():
    """Jinja's immutable sandbox with the bounds ChatTemplate describes (built once)."""
    global _CHAT_ENV
    if _CHAT_ENV is not None:
        return _CHAT_ENV
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def big(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_CHAT_CHARS

    def check_args(args: tuple, kwargs: dict) -> None:
        if any(big(a) for a in (*args, *kwargs.values())):
            raise _ChatBound(f"a width or count above {MAX_CHAT_CHARS:,}")

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "%"})

        def call_binop(self, context, operator, left, right):
            if operator == "**" and isinstance(right, int) and abs(right) > MAX_CHAT_EXPONENT:
                raise _ChatBound(f"a power above {MAX_CHAT_EXPONENT}")
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_CHAT_CHARS:
                        raise _ChatBound(f"a string or list longer than {MAX_CHAT_CHARS:,}")
            if operator == "%" and isinstance(left, str) and re.search(r"\d{7,}", left):
                raise _ChatBound(f"a format wider than {MAX_CHAT_CHARS:,}")
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja's own signature
            check_args(args, kwargs)
            return super().call(__context, __obj, *args, **kwargs)

        def wrap_str_format(self, value):  # str.format and format_map: no field wider than the bound
            if isinstance(getattr(value, "__self__", None), str) and re.search(r"\d{7,}", value.__self__):
                raise _ChatBound(f"a format wider than {MAX_CHAT_CHARS:,}")
            return super().wrap_str_format(value)

    def bounded(fn):
        def filter_(*args, **kwargs):
            check_args(args[1:], kwargs)
            return fn(*args, **kwargs)
        for attr in ("jinja_pass_arg",):  # (filters that take the context or environment keep saying so)
            if hasattr(fn, attr):
                setattr(filter_, attr, getattr(fn, attr))
        return filter_

    def raise_exception(message: str = "") -> None:
        raise _ChatRefusal(str(message))

    env = Bounded(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters = {name: bounded(fn) for name, fn in env.filters.items()}
    env.globals["raise_exception"] = raise_exception
    _CHAT_ENV = env
    return env


_CHAT_ENV = None
