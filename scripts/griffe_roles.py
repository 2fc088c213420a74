"""A griffe extension for the docs site (mkdocs.yml): the docstrings' Sphinx roles
(:class:`Lock`, :meth:`Client.open`, :func:`aiodlock.connect`, :data:`LostCallback`) become
Markdown, with a link where the name is a public name of aiodlock, code elsewhere."""

from __future__ import annotations

import re
from typing import Any

import griffe

import aiodlock

ROLE = re.compile(r":(?:class|meth|func|attr|data|exc|mod|obj):`~?([^`]+)`")
PUBLIC = set(aiodlock.__all__)


def markdown(text: str, owner: str | None = None) -> str:
    """``text`` with every role written as Markdown; ``owner``: the class whose docstring it is
    (a bare method name is one of its members)."""

    def link(match: re.Match[str]) -> str:
        target = match.group(1).removeprefix("aiodlock.")
        shown = target.rsplit(".", 1)[-1] if "~" in match.group(0) else target
        head = target.split(".", 1)[0]
        if head in PUBLIC:
            return f"[`{shown}`][aiodlock.{target}]"
        if owner and "." not in target and target in public_members(owner):
            return f"[`{shown}`][aiodlock.{owner}.{target}]"
        return f"`{shown}`"

    return ROLE.sub(link, text)


def public_members(name: str) -> set[str]:
    return {member for member in dir(getattr(aiodlock, name)) if not member.startswith("_")}


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, node: Any, obj: griffe.Object, agent: Any, **kwargs: Any) -> None:
        if obj.docstring is None:
            return
        owner = obj.parent.name if obj.parent is not None and obj.parent.is_class else None
        if obj.is_class:
            owner = obj.name
        obj.docstring.value = markdown(obj.docstring.value, owner if owner in PUBLIC else None)
