"""The jinja2 environment for the userdata/ templates: strict about undefined names, and every
interpolated value shell-quoted unless the template marks it ``| raw``."""

from __future__ import annotations

import shlex
from functools import cache
from importlib.resources import files
from typing import Any

import jinja2


class Unquoted(str):
    """A value ``finalize`` passes through as it is (the ``raw`` filter)."""


def _template_source(name: str) -> str:
    return files("neuron_serving.userdata").joinpath(name).read_text(encoding="utf-8")


def _finalize(value: object) -> str:
    if isinstance(value, Unquoted):
        return str(value)
    return shlex.quote(str(value))


@cache
def environment() -> jinja2.Environment:
    """Templates whose ``{{ x }}`` expands to ``shlex.quote(str(x))``.

    Quoting by default means a model id, an image name or a secret id can never break out of its
    word in a boot script. Values that are already safe (integers, fixed names) quote to
    themselves, so config files that are not shell read naturally; ``{{ x | raw }}`` is for text
    that must not be quoted, such as one rendered template embedded in another.
    """
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_template_source),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        finalize=_finalize,
    )
    env.filters["raw"] = Unquoted
    return env


def render(name: str, **context: Any) -> str:
    """Render ``userdata/<name>`` with ``context``."""
    return environment().get_template(name).render(**context)
