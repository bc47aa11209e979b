"""The public API's docstrings state their contract in Google style (issue #26, point 6).

Every public method (a name without a leading ``_``) that a plugin base class, the probe or the registry defines
itself has a docstring; one that takes parameters (besides ``self``/``cls``) has an ``Args:`` section, and one
whose return annotation is not ``None`` has a ``Returns:`` section (``Yields:`` for a context manager or
generator). A property needs a docstring only: it documents an attribute, whose docstring says what it is.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from chaosbench.frameworks.base import Framework
from chaosbench.injectors.base import Injector
from chaosbench.probe import Probe
from chaosbench.registry import Registry
from chaosbench.runtimes.base import Runtime
from chaosbench.workloads.base import Workload

API_CLASSES: list[type] = [Runtime, Framework, Injector, Workload, Probe, Registry]


def _public_members(cls: type) -> list[tuple[str, Any]]:
    """(name, member) for each public method or property ``cls`` defines itself (inherited ones are checked on
    the class that defines them)."""
    out = []
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, (classmethod, staticmethod)):
            out.append((name, member.__func__))
        elif isinstance(member, property) or inspect.isfunction(member):
            out.append((name, member))
    return out


def docstring_problems(cls: type) -> list[str]:
    """What is missing from the docstrings of ``cls``'s public methods, one line each."""
    problems = []
    for name, member in _public_members(cls):
        where = f"{cls.__name__}.{name}"
        doc = inspect.cleandoc(member.__doc__ or "")
        if not doc:
            problems.append(f"{where}: no docstring")
            continue
        if isinstance(member, property):
            continue
        signature = inspect.signature(member)  # follows __wrapped__ (a context manager's own function)
        params = [p for p in signature.parameters if p not in ("self", "cls")]
        if params and "\nArgs:\n" not in f"\n{doc}\n":
            problems.append(f"{where}: takes {', '.join(params)} but has no 'Args:' section")
        returns = signature.return_annotation
        returns_none = returns in (None, "None") or returns is inspect.Signature.empty
        if not returns_none and not any(f"\n{s}:\n" in f"\n{doc}\n" for s in ("Returns", "Yields")):
            problems.append(f"{where}: returns {returns} but has no 'Returns:' section")
    return problems


@pytest.mark.parametrize("cls", API_CLASSES, ids=lambda c: c.__name__)
def test_public_methods_document_args_and_returns(cls: type) -> None:
    assert docstring_problems(cls) == []


def test_the_check_finds_what_is_missing() -> None:
    class Bare:
        def undocumented(self) -> None:
            pass

        def no_args(self, count: int) -> None:
            """Does something."""

        def no_returns(self) -> int:
            """Gives something."""
            return 0

        @classmethod
        def fine(cls, count: int) -> int:
            """Gives ``count``.

            Args:
                count: How many.

            Returns:
                ``count``.
            """
            return count

        @property
        def bare_property(self) -> int:
            return 0

        def _private(self, count: int) -> int:
            return count

    assert docstring_problems(Bare) == [
        "Bare.undocumented: no docstring",
        "Bare.no_args: takes count but has no 'Args:' section",
        "Bare.no_returns: returns int but has no 'Returns:' section",
        "Bare.bare_property: no docstring",
    ]
