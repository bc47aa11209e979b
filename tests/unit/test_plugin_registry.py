"""A registry checks a plugin when it is registered or loaded: its name, its base class, its options model."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel, ConfigDict

from chaosbench.errors import ChaosbenchError, PluginError, UnknownPlugin
from chaosbench.injectors.base import FaultContext, Injector, NoParams
from chaosbench.registry import Registry

GROUP = "chaosbench.test-plugins"


class TapParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    times: int = 1


class TapInjector(Injector[TapParams]):
    name: ClassVar[str] = "tap"

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        return {"times": self.params.times}


class NotAnInjector:
    """Looks like an injector, subclasses nothing of chaosbench's."""

    name: ClassVar[str] = "not-an-injector"
    Params = TapParams


class DictParamsInjector(TapInjector):
    """Its params are a dict, not a pydantic model."""

    Params = dict  # type: ignore[assignment]


class OtherParams(BaseModel):
    pass


class MismatchedInjector(Injector[TapParams]):
    """Says TapParams as its type argument but OtherParams as its Params."""

    name: ClassVar[str] = "mismatched"
    Params = OtherParams

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        return {}


def _injectors() -> Registry[Injector[Any]]:
    return Registry("injector", GROUP, {}, base="chaosbench.injectors.base:Injector", model="Params")


def test_the_type_argument_is_the_plugins_params_model() -> None:
    assert TapInjector.Params is TapParams
    assert Injector.Params is NoParams  # an injector that takes none
    reg = _injectors()
    reg.register("tap", TapInjector)
    assert reg.get("tap") is TapInjector


@pytest.mark.parametrize(
    ("plugin", "what"),
    [
        (NotAnInjector, "not a subclass"),
        (DictParamsInjector, "not a pydantic model"),
        (MismatchedInjector, "not its type argument"),
    ],
)
def test_a_bad_plugin_is_refused_when_registered_naming_it(plugin: type, what: str) -> None:
    reg = _injectors()
    with pytest.raises(PluginError) as caught:
        reg.register("bad", plugin)
    err = caught.value
    assert (err.kind, err.name) == ("injector", "bad")
    assert err.source == f"{__name__}:{plugin.__qualname__}"
    assert what in err.problem
    assert "bad" not in reg.names()  # not half-registered


def test_a_malformed_name_is_refused() -> None:
    with pytest.raises(PluginError) as caught:
        _injectors().register("Tap_1", TapInjector)
    assert caught.value.name == "Tap_1"


@pytest.mark.parametrize("attr", ["NotAnInjector", "DictParamsInjector"])
def test_a_bad_entry_point_is_refused_when_loaded_naming_the_entry_point(
    monkeypatch: pytest.MonkeyPatch, attr: str
) -> None:
    ep = EntryPoint("bad-ep", f"{__name__}:{attr}", GROUP)
    monkeypatch.setattr("chaosbench.registry.entry_points", lambda group: [ep] if group == GROUP else [])
    reg = _injectors()
    assert "bad-ep" in reg.names()
    with pytest.raises(PluginError) as caught:
        reg.get("bad-ep")
    err = caught.value
    assert (err.kind, err.name) == ("injector", "bad-ep")
    assert err.source == f"entry point 'bad-ep = {__name__}:{attr}' (group {GROUP})"


def test_an_entry_point_that_cannot_load_is_a_plugin_error(monkeypatch: pytest.MonkeyPatch) -> None:
    ep = EntryPoint("gone", "chaosbench_no_such_module:Thing", GROUP)
    monkeypatch.setattr("chaosbench.registry.entry_points", lambda group: [ep] if group == GROUP else [])
    with pytest.raises(PluginError) as caught:
        _injectors().get("gone")
    assert caught.value.source == f"entry point 'gone = chaosbench_no_such_module:Thing' (group {GROUP})"
    assert isinstance(caught.value.__cause__, ImportError)


def test_unknown_and_taken_names_are_plugin_errors_too() -> None:
    reg = _injectors()
    reg.register("tap", TapInjector)
    with pytest.raises(UnknownPlugin) as unknown:
        reg.get("tip")
    assert isinstance(unknown.value, PluginError) and unknown.value.known == ["tap"]
    with pytest.raises(PluginError) as taken:
        reg.register("tap", TapInjector)
    assert isinstance(taken.value, ChaosbenchError) and taken.value.problem == "already registered"
