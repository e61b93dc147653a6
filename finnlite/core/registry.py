"""The pass registry: a pass name (or a FINN/qonnx alias) to its class.

Passes are registered explicitly with :func:`register_pass` when the module defining them is imported; each
package imports all of its pass modules in its ``__init__``, so ``import streamline`` registers every rule.
Nothing is looked up with ``eval``. A pass may declare ``aliases``: the names of FINN/qonnx transformations it
covers (alone or as part of a more general rewrite); :func:`get_pass` resolves them, and no alias may be a pass
name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from finnlite.core.errors import PassError

if TYPE_CHECKING:
    from finnlite.core.passes import Pass

_REGISTRY: dict[str, type[Pass]] = {}
_ALIASES: dict[str, str] = {}  # FINN/qonnx name -> registered pass name


def register_pass(cls: type[Pass] | None = None, *, group: str | None = None) -> Any:
    """Class decorator that registers a pass under its name (``@register_pass`` or
    ``@register_pass(group="absorb")``). Registering two different classes under one name is an error."""

    def deco(c: type[Pass]) -> type[Pass]:
        if group is not None:
            c.group = group
        old = _REGISTRY.get(c.name)
        if old is not None and old is not c and (old.__module__, old.__qualname__) != (c.__module__, c.__qualname__):
            raise PassError(f"a pass named '{c.name}' is registered twice ({old.__module__}, {c.__module__})")
        if c.name in _ALIASES:
            raise PassError(f"pass name '{c.name}' is already an alias of {_ALIASES[c.name]}")
        for alias in c.__dict__.get("aliases", ()):
            if alias in _REGISTRY or _ALIASES.get(alias, c.name) != c.name:
                taken = "a pass" if alias in _REGISTRY else f"an alias of {_ALIASES[alias]}"
                raise PassError(f"alias '{alias}' of {c.name} is already {taken}")
        _REGISTRY[c.name] = c
        _ALIASES.update((alias, c.name) for alias in c.__dict__.get("aliases", ()))
        return c

    return deco(cls) if cls is not None else deco


def get_pass(name: str) -> type[Pass]:
    """The registered pass class called ``name``, or the pass an alias (a FINN/qonnx name) stands for."""
    try:
        return _REGISTRY[_ALIASES.get(name, name)]
    except KeyError:
        raise PassError(f"no pass named '{name}' is registered") from None


def list_aliases() -> dict[str, str]:
    """Every alias (a FINN/qonnx transformation name) and the registered pass it stands for, sorted by alias."""
    return dict(sorted(_ALIASES.items()))


def list_passes(group: str | None = None) -> list[type[Pass]]:
    """Registered passes (of one group, if given), sorted by group and name."""
    found = [c for c in _REGISTRY.values() if group is None or c.group == group]
    return sorted(found, key=lambda c: (c.group, c.name))
