"""``data.chat_template``: the chat template a chat dataset is rendered with, when the
tokenizer has none or the wrong one.

The value is either the name of one of the tokenizer's named templates
(tokenizer_config.json's ``chat_template`` as a list of ``{name, template}``) or the
absolute path of a Jinja file inside the tenant's data area. A file is untrusted input:
it is read where it is used, through the job's roots (no link out, a regular file, at
most :data:`MAX_TEMPLATE_BYTES`), and parsed in Jinja's sandbox (transformers renders
templates in an immutable sandboxed environment too), so a template can neither reach
Python objects nor change state; a syntax error names the field and the line.
"""

from __future__ import annotations

import re

from jinja2 import TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from workers.storage.confine import ConfinementError, Roots, read_bounded

MAX_TEMPLATE_BYTES = 256 * 1024
# A value that is a template's name (never a template's text, which holds '{').
NAME_LIKE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def is_template_file(value: str | None) -> bool:
    """Whether a ``chat_template`` value names a file (an absolute path) and not a name."""
    return bool(value) and value.startswith("/")


def check_template_text(text: str, *, field: str) -> str:
    """``text`` if Jinja's sandbox parses it; else a ValueError naming ``field`` and the
    line of the error."""
    try:
        ImmutableSandboxedEnvironment().parse(text)
    except TemplateSyntaxError as e:
        raise ValueError(
            f"{field}: the template does not parse (line {e.lineno}: {e.message})"
        ) from None
    return text


def read_template(path: str, *, field: str, roots: Roots | None = None) -> str:
    """The template in the file at ``path``, read beneath ``roots`` (default: the job's),
    checked by :func:`check_template_text`; errors name ``field``."""
    try:
        raw = read_bounded(
            path, Roots.from_env() if roots is None else roots, MAX_TEMPLATE_BYTES, what=field
        )
    except ConfinementError as e:
        message = str(e)
        raise ConfinementError(message if message.startswith(field) else f"{field} {e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{field} {path}: the template is not UTF-8 text") from None
    return check_template_text(text, field=field)


def resolve(value: str | None, *, field: str, roots: Roots | None = None) -> str | None:
    """What a tokenizer renders with: a file's template text, or a name (looked up in the
    tokenizer's named templates when it renders), or None (the tokenizer's own)."""
    if value is None or not is_template_file(value):
        return value
    return read_template(value, field=field, roots=roots)


def check_named(tok, name: str, *, field: str) -> None:
    """A ValueError naming ``field`` unless the tokenizer has a template called ``name``."""
    named = tok.chat_template if isinstance(tok.chat_template, dict) else {}
    if name not in named:
        have = ", ".join(sorted(named)) or "none (it has one unnamed template or none)"
        raise ValueError(
            f"{field} {name!r} is not a template of the tokenizer (its named templates: "
            f"{have}); name one of them, or give the absolute path of a Jinja file"
        )
