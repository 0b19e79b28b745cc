#!/usr/bin/env python3
"""Writes docs/api.md, the API reference, from the docstrings of everything ``neuron_serving``
exports (``__all__``): ``python scripts/api_reference.py`` (``--check`` fails when it is stale;
the tests run the check). Markdown, so it reads on GitHub and in any editor, without a docs site."""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "api.md"

HEADER = """# API reference

Generated from the docstrings by `python scripts/api_reference.py`; do not edit by hand. Every name
here is importable from `neuron_serving`. For a guided tour, see [the platform-team
guide](platform-teams.md); for the settings as a table,
[Configuration](configuration.md).
"""


def reference() -> str:
    import neuron_serving

    sections = [HEADER, "## Contents", ""]
    names = sorted(neuron_serving.__all__, key=lambda n: (not isinstance(getattr(neuron_serving, n), type), n))
    sections += [f"- [`{name}`](#{name.lower()})" for name in names]
    for name in names:
        sections += ["", _section(name, getattr(neuron_serving, name))]
    return "\n".join(sections).rstrip() + "\n"


def _section(name: str, obj: Any) -> str:
    lines = [f"## {name}", ""]
    if isinstance(obj, type):
        lines += ["```python", f"class {name}{_signature(obj)}", "```", "", _doc(obj)]
        for member_name, member in _members(obj):
            lines += ["", f"### {name}.{member_name}", ""]
            if isinstance(member, property):
                lines += [f"Property. {_doc(member)}"]
            else:
                lines += ["```python", f"{member_name}{_signature(member)}", "```", "", _doc(member)]
    elif callable(obj):
        lines += ["```python", f"def {name}{_signature(obj)}", "```", "", _doc(obj)]
    else:
        lines += [f"A `{type(obj).__name__}` of {len(obj)} entries." if hasattr(obj, "__len__") else repr(obj)]
    return "\n".join(lines).rstrip()


def _members(cls: type) -> list[tuple[str, Any]]:
    """Public methods and properties defined by ``cls`` itself (not inherited from aws-cdk-lib)."""
    members = []
    for member_name, member in vars(cls).items():
        if member_name.startswith("_"):
            continue
        if isinstance(member, classmethod | staticmethod):
            member = member.__func__
        if (isinstance(member, property) or inspect.isfunction(member)) and member.__doc__:
            members.append((member_name, member))
    return members


def _signature(obj: Any) -> str:
    from neuron_serving.settings import StackSettings

    if obj is StackSettings:
        # Its fields are the settings, which docs/configuration.md lists (one place, generated).
        return "(**settings)"
    # jsii's metaclass hides a construct's own __init__ behind (*args, **kwargs): read __init__ itself.
    target = obj.__init__ if isinstance(obj, type) and "__init__" in vars(obj) else obj
    try:
        try:
            signature = inspect.signature(target, eval_str=True)
        except NameError:  # an annotation imported only for type checkers
            signature = inspect.signature(target)
    except (TypeError, ValueError):
        return "(...)"
    parameters = [p for p in signature.parameters.values() if p.name not in ("self", "cls")]
    text = _stable(str(signature.replace(parameters=parameters, return_annotation=inspect.Signature.empty)))
    if len(text) <= 100:
        return text
    lines = _parameter_texts(signature.replace(parameters=parameters))
    return "(\n" + "".join(f"    {_stable(p)},\n" for p in lines) + ")"


def _parameter_texts(signature: inspect.Signature) -> list[str]:
    texts, keyword_only_marked = [], False
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and not keyword_only_marked:
            texts.append("*")
            keyword_only_marked = True
        texts.append(str(parameter))
    return texts


def _stable(text: str) -> str:
    """Without the memory addresses of default objects' reprs, which change every run."""
    return re.sub(r" at 0x[0-9a-f]+", "", text)


def _doc(obj: Any) -> str:
    """``obj``'s docstring; the settings' ``:param`` lines that StackSettings and NeuronLlamaStack
    carry for IDEs (``settings_docstring``) become a link to the settings' own page, where a new
    setting then appears once."""
    from neuron_serving.settings import settings_docstring

    doc = inspect.getdoc(obj) or "(undocumented)"
    settings = settings_docstring(indent="").strip()
    if doc.endswith(settings):
        doc = doc[: -len(settings)].rstrip().removesuffix(
            "The settings, from their definitions (the table in docs/configuration.md is made from them too):").rstrip()
        doc += ("\n\nEvery setting is a keyword argument: see [Configuration](configuration.md), generated from "
                "the same definitions.")
    return doc


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail when docs/api.md differs from the docstrings")
    args = parser.parse_args(argv)
    text = reference()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text(encoding="utf-8") != text:
            print(f"{OUTPUT.relative_to(ROOT)} is stale: run python scripts/api_reference.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
