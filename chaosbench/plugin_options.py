"""The options model a plugin declares as its base's type argument (``class KillInjector(Injector[KillParams])``).

A leaf module: the plugin bases read it when a subclass is made (to set its ``Params``/``Options``) and the
registries when they check a plugin, without either importing the other.
"""

from __future__ import annotations

from typing import Any, TypeVar, get_args, get_origin


def model_argument(cls: type, generic: type) -> Any:
    """The type argument ``cls`` gives its generic base ``generic`` (``class KillInjector(Injector[KillParams])``
    -> ``KillParams``), from the nearest class of its MRO that gives one; None when none does (``generic``
    unparameterized, or given a type variable: ``class PlantedInjector(Injector[P])``). Not checked to be a
    model: the registry does that, naming the plugin."""
    for klass in cls.__mro__:
        for base in klass.__dict__.get("__orig_bases__", ()):
            origin = get_origin(base)
            args = get_args(base)
            if isinstance(origin, type) and issubclass(origin, generic) and args:
                if not isinstance(args[0], TypeVar):
                    return args[0]
    return None


def adopt_model(cls: type, generic: type, attr: str) -> None:
    """Set ``cls.<attr>`` (its ``Params`` or ``Options``) to the type argument it gives ``generic``
    (:func:`model_argument`), unless the class sets that attribute itself or gives no argument. What each plugin
    base's ``__init_subclass__`` does."""
    if attr not in cls.__dict__:
        model = model_argument(cls, generic)
        if model is not None:
            setattr(cls, attr, model)
