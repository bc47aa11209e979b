"""Suite and fault specs: typed models loaded from YAML and validated before anything runs.

A suite file looks like::

    name: smoke
    seed: 7
    defaults:
      runtime: local
      deadline_s: 120
      workload: {name: ddp-mlp, ranks: 2, steps: 60, checkpoint_every: 10}
    frameworks:
      restart: {max_restarts: 3, heartbeat_timeout_s: 5}
      torchrun-default: {adapter: torchrun, max_restarts: 3}
    faults:
      kill-rank1: {injector: kill, target: {rank: 1}, trigger: {at_step: 25}}
    matrix:
      frameworks: [restart, torchrun-default]
      faults: [kill-rank1]
      repeats: 2

Every problem is reported as one line naming the file, the line and the object:
``suites/x.yaml:12: fault 'kill-rank1': unknown injector 'kil' (known: hang, kill)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from chaosbench.errors import SpecError, UnknownPlugin

# The model lives in chaosbench.spec_model (a leaf the plugin bases can name); it is re-exported here, where
# suites are loaded and where users have imported it from.
from chaosbench.spec_model import (  # noqa: F401
    RECOVERY_PHASES,
    ROLES,
    SAFE_NAME,
    UNION_TAGS,
    Bound,
    Defaults,
    EventMatch,
    FaultSpec,
    FrameworkSpec,
    Matrix,
    MatrixPart,
    Path_,
    Poisson,
    Projection,
    Repeats,
    Scenario,
    Slos,
    SourceMap,
    Suite,
    Target,
    Trigger,
    UntilDecided,
    WorkloadSpec,
    load_yaml,
    load_yaml_text,
    repeats_bound,
    schedules,
    slo_problem,
    slo_unmeetable,
    slos_as_data,
)


def _what(loc: Path_) -> str:
    """Name the user's object a pydantic location points into."""
    if len(loc) >= 2 and loc[0] == "faults":
        return f"fault '{loc[1]}': "
    if len(loc) >= 2 and loc[0] == "frameworks":
        return f"framework '{loc[1]}': "
    if loc and loc[0] in ("defaults", "matrix"):
        return f"{loc[0]}: "
    return ""


def _field_path(loc: Path_, skip: int) -> str:
    rest = [
        str(p)
        for p in loc[skip:]
        if not (isinstance(p, str) and p in ("function-after", "function-before", *UNION_TAGS))
    ]
    return ".".join(rest)


#: Errors of a value of the wrong type (strict validation: a boolean is not a number, a float not an integer, a
#: number not a boolean): their message shows the value given.
_TYPE_ERRORS = ("int_type", "bool_type", "float_type", "string_type")


def _message(err: Any) -> str:
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] in _TYPE_ERRORS:
        msg += f" (got {err['input']!r})"
    return msg


def validation_error(exc: ValidationError, smap: SourceMap, base: Path_ = ()) -> SpecError:
    """The first error of a pydantic ValidationError as a :class:`SpecError`: its line, the user's object it is
    in (``obj``) and ``field: message`` (``problem``)."""
    err = exc.errors()[0]
    loc = base + tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
    what = _what(loc)
    skip = 2 if what.startswith(("fault ", "framework ")) else (1 if what else 0)
    fld = _field_path(loc, skip)
    msg = _message(err)
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] == "missing":
        msg = "required key is missing"
    more = f" (and {len(exc.errors()) - 1} more problems)" if len(exc.errors()) > 1 else ""
    return smap.error(loc, f"{fld + ': ' if fld else ''}{msg}{more}", obj=what.removesuffix(": ") or None)


def validate_plugin_options(
    options_model: type[BaseModel], options: dict[str, Any], smap: SourceMap, base: Path_, what: str
) -> BaseModel:
    """Validate a plugin's own options; errors name the plugin object and the YAML line."""
    try:
        return options_model.model_validate(options, strict=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = base + tuple(err["loc"])
        msg = "unknown option" if err["type"] == "extra_forbidden" else _message(err)
        if err["type"] == "missing":
            msg = "required option is missing"
        fld = ".".join(str(p) for p in err["loc"])
        raise smap.error(loc, f"{fld + ': ' if fld else ''}{msg}", obj=what) from None


def load_suite(path: str | Path) -> Suite:
    """Load and fully validate a suite file, including every plugin's own options."""
    data, smap = load_yaml(path)
    return suite_from_data(data, smap)


#: The package the fault library ships in (``faults/*.yaml`` of the repository, as package data).
FAULT_LIBRARY = "chaosbench.fault_library"
#: The longest name ``use:`` takes (a file name must fit the filesystem's limit).
MAX_FAULT_NAME = 200


def fault_search_path(suite_file: str) -> list[Path]:
    """The suite's own folders ``use: NAME`` looks in for ``NAME.yaml``, in order: ``faults/`` beside the suite's
    folder (the repository layout ``suites/x.yaml`` + ``faults/``), ``faults/`` inside it, then ``./faults``.
    After them comes the fault library that ships with chaosbench (:func:`fault_library`)."""
    here = Path(suite_file).resolve().parent
    out = []
    for d in (here.parent / "faults", here / "faults", Path.cwd() / "faults"):
        if d not in out:
            out.append(d)
    return out


def fault_library() -> dict[str, Path]:
    """The fault definitions that ship inside the package: name -> file, read through importlib.resources
    (:data:`FAULT_LIBRARY`; in a checkout, ``chaosbench/fault_library`` links to ``faults/``). Empty when the
    package has none."""
    import importlib.resources

    try:
        root = importlib.resources.files(FAULT_LIBRARY)
    except ModuleNotFoundError:
        return {}
    return {
        e.name.removesuffix(".yaml"): Path(str(e))
        for e in root.iterdir()
        if e.name.endswith(".yaml") and e.is_file()
    }


@dataclass(frozen=True)
class FaultDefinition:
    """A fault definition ``use: NAME`` finds: its file, and whether it is the suite's own or shipped with
    chaosbench (``builtin``); ``shadows``: a built-in definition of the same name that it overrides."""

    name: str
    file: Path
    builtin: bool
    shadows: Path | None = None


def fault_definitions(suite_file: str) -> dict[str, FaultDefinition]:
    """Every definition ``use:`` can name from a suite at ``suite_file``: the first folder of
    :func:`fault_search_path` that has ``NAME.yaml`` wins, then the shipped library (:func:`fault_library`)."""
    library = fault_library()
    out: dict[str, FaultDefinition] = {}
    for d in fault_search_path(suite_file):
        if not d.is_dir():
            continue
        for p in sorted(d.glob("*.yaml")):
            if p.stem not in out and p.is_file():
                shadows = library.get(p.stem)
                same = shadows is not None and shadows.resolve() == p.resolve()
                out[p.stem] = FaultDefinition(p.stem, p, builtin=same, shadows=None if same else shadows)
    for name, p in library.items():
        out.setdefault(name, FaultDefinition(name, p, builtin=True))
    return dict(sorted(out.items()))


def _fault_definition_file(use: str, suite_file: str) -> Path | None:
    """The file of fault definition ``use`` for a suite at ``suite_file`` (see :func:`fault_definitions`)."""
    for d in fault_search_path(suite_file):
        if (d / f"{use}.yaml").is_file():
            return d / f"{use}.yaml"
    return fault_library().get(use)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _resolve_fault_uses(data: dict[str, Any], smap: SourceMap) -> None:
    """Replace each fault's ``use: NAME`` by the definition in ``NAME.yaml`` (the suite's own ``faults/`` first,
    then the library shipped with chaosbench: :func:`fault_definitions`), overridden by the keys given beside
    ``use``."""
    faults = data.get("faults")
    if not isinstance(faults, dict):
        return
    for name, entry in faults.items():
        if not isinstance(entry, dict) or "use" not in entry:
            continue
        use = entry["use"]
        at: Path_ = ("faults", name, "use")
        if not isinstance(use, str) or not use or "/" in use or "\0" in use:
            raise smap.error(at, "use: give the name of a fault definition in faults/", obj=f"fault '{name}'")
        if len(use) > MAX_FAULT_NAME:
            raise smap.error(
                at,
                f"use: a fault definition's name has at most {MAX_FAULT_NAME} characters "
                f"(this one {len(use)})",
                obj=f"fault '{name}'",
            )
        found = _fault_definition_file(use, smap.file)
        if found is None:
            known = sorted(fault_definitions(smap.file))
            raise smap.error(
                at,
                f"no fault definition '{use}' (known: {', '.join(known) or 'none'})",
                obj=f"fault '{name}'",
            )
        base, bmap = load_yaml(found)
        if not isinstance(base, dict):
            raise bmap.error((), "a fault definition must be a YAML mapping")
        try:
            FaultSpec.model_validate(base, strict=True)
        except ValidationError as exc:
            err = exc.errors()[0]
            raise bmap.error(
                tuple(err["loc"]),
                f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}",
                obj=f"fault definition '{use}'",
            ) from None
        faults[name] = _merge(base, {k: v for k, v in entry.items() if k != "use"})


def suite_from_data(data: Any, smap: SourceMap) -> Suite:
    if not isinstance(data, dict):
        raise smap.error((), "a suite must be a YAML mapping with at least 'name' and 'matrix'")
    _resolve_fault_uses(data, smap)
    try:
        suite = Suite.model_validate(data, strict=True)
    except ValidationError as exc:
        raise validation_error(exc, smap) from None
    suite.set_source(smap.file, smap)
    _check_references(suite, smap)
    return suite


def _check_references(suite: Suite, smap: SourceMap) -> None:
    """Every name the suite uses is known and every plugin's options valid, checked in this order (the first
    problem raises a :class:`SpecError` at its place in the YAML): frameworks, the matrix's fault names, the faults,
    the runtime, the workloads, then faults against workloads, phase triggers and SLOs."""
    _check_frameworks(suite, smap)
    _check_fault_names(suite, smap)
    _check_faults(suite, smap)
    _check_runtime(suite, smap)
    _check_workloads(suite, smap)
    _check_fault_workloads(suite, smap)
    _check_phase_triggers(suite, smap)
    _check_slos(suite, smap)


def _check_frameworks(suite: Suite, smap: SourceMap) -> None:
    """Each framework label (the matrix's, then the suite's others) names a known adapter with valid options."""
    from chaosbench.registry import FRAMEWORKS

    in_matrix = suite.matrix.all_frameworks()
    labels = in_matrix + [f for f in suite.frameworks if f not in in_matrix]
    for fw in labels:
        adapter = suite.framework_spec(fw).adapter or fw
        try:
            cls = FRAMEWORKS.get(adapter)
        except UnknownPlugin as exc:
            where: Path_ = (
                ("frameworks", fw, "adapter")
                if fw in suite.frameworks
                else ("matrix", "frameworks", suite.matrix.frameworks.index(fw))
                if fw in suite.matrix.frameworks
                else ("matrix", "include")
            )
            raise smap.error(where, str(exc), obj=f"framework '{fw}'") from None
        validate_plugin_options(
            cls.Options, suite.framework_spec(fw).options, smap, ("frameworks", fw), f"framework '{fw}'"
        )


def _check_fault_names(suite: Suite, smap: SourceMap) -> None:
    """Every fault the matrix schedules (its own and its includes') is defined under ``faults``."""
    entries: list[tuple[Path_, list[str]]] = [
        (("matrix", "faults", i), n) for i, n in enumerate(schedules(suite.matrix.faults))
    ]
    for j, part in enumerate(suite.matrix.include):
        entries += [(("matrix", "include", j, "faults", i), n) for i, n in enumerate(schedules(part.faults))]
    for where, names in entries:
        for name in names:
            if name not in suite.faults:
                known = ", ".join(sorted(suite.faults)) or "none defined"
                raise smap.error(where, f"unknown fault '{name}' (known: {known})", obj="matrix")


def _check_faults(suite: Suite, smap: SourceMap) -> None:
    """Each fault names a known injector with valid params, targets ranks and nodes the workload has, has a
    trigger exactly when its injector needs one, and a target its injector accepts."""
    from chaosbench.registry import INJECTORS

    for name, fault in suite.faults.items():
        try:
            inj = INJECTORS.get(fault.injector)
        except UnknownPlugin as exc:
            raise smap.error(("faults", name, "injector"), str(exc), obj=f"fault '{name}'") from None
        validate_plugin_options(inj.Params, fault.params, smap, ("faults", name, "params"), f"fault '{name}'")
        ranks = suite.defaults.workload.ranks
        for r in fault.target.rank_numbers():
            if r >= ranks:
                raise smap.error(
                    ("faults", name, "target"),
                    f"target rank {r} does not exist (the workload has {ranks} ranks)",
                    obj=f"fault '{name}'",
                )
        node = fault.target.node
        if node is not None and node != "random":
            nodes = [f"node{i}" for i in range(suite.defaults.workload.nodes)]
            if node not in nodes:
                raise smap.error(
                    ("faults", name, "target"),
                    f"target node '{node}' does not exist (nodes: {', '.join(nodes)})",
                    obj=f"fault '{name}'",
                )
        if fault.trigger is None and inj.requires_trigger:
            raise smap.error(("faults", name), "trigger: required key is missing", obj=f"fault '{name}'")
        if fault.trigger is not None and not inj.requires_trigger:
            raise smap.error(
                ("faults", name, "trigger"),
                f"injector '{fault.injector}' fires from inside the "
                "workload (see its params); remove the trigger",
                obj=f"fault '{name}'",
            )
        problem = inj.role_problem(fault.target) or inj.check_target(fault.target, fault.trigger)
        if problem:
            raise smap.error(("faults", name), problem, obj=f"fault '{name}'")


def _check_runtime(suite: Suite, smap: SourceMap) -> None:
    """The default runtime is known, its options valid (alone and with each framework's own), and every fault's
    injector works on it."""
    from chaosbench.registry import INJECTORS, RUNTIMES

    try:
        rt_cls = RUNTIMES.get(suite.defaults.runtime)
    except UnknownPlugin as exc:
        raise smap.error(("defaults", "runtime"), str(exc), obj="defaults") from None
    try:
        rt_cls.Options.model_validate(suite.defaults.runtime_options, strict=True)
    except ValidationError as exc:
        raise validation_error(exc, smap, ("defaults", "runtime_options")) from None
    for label, fspec in suite.frameworks.items():
        try:
            rt_cls.Options.model_validate(
                {**suite.defaults.runtime_options, **(fspec.runtime_options or {})}, strict=True
            )
        except ValidationError as exc:
            raise validation_error(exc, smap, ("frameworks", label, "runtime_options")) from None
    for name, fault in suite.faults.items():
        inj = INJECTORS.get(fault.injector)
        problem = inj.check_runtime(rt_cls, inj.Params.model_validate(fault.params))
        if problem:
            raise smap.error(("faults", name, "params"), problem, obj=f"fault '{name}'")


def _check_workloads(suite: Suite, smap: SourceMap) -> None:
    """The default workload and each framework's own are known, with valid options."""
    from chaosbench.registry import WORKLOADS

    wl = suite.defaults.workload
    try:
        wcls = WORKLOADS.get(wl.name)
    except UnknownPlugin as exc:
        raise smap.error(("defaults", "workload", "name"), str(exc), obj="workload") from None
    validate_plugin_options(wcls.Options, wl.options, smap, ("defaults", "workload"), f"workload '{wl.name}'")
    for fw, spec in suite.frameworks.items():
        if not spec.workload:
            continue
        wl_at: Path_ = ("frameworks", fw, "workload")
        try:
            own = suite.workload_for(fw)
            ocls = WORKLOADS.get(own.name)
        except ValidationError as exc:
            raise validation_error(exc, smap, wl_at) from None
        except UnknownPlugin as exc:
            raise smap.error(wl_at + ("name",), f"workload: {exc}", obj=f"framework '{fw}'") from None
        validate_plugin_options(
            ocls.Options, own.options, smap, wl_at, f"framework '{fw}' workload '{own.name}'"
        )


def _check_slos(suite: Suite, smap: SourceMap) -> None:
    """Every SLO's value has its metric's type (:func:`slo_problem`) and some run can meet it
    (:func:`slo_unmeetable`)."""
    at: list[tuple[Path_, str, Slos]] = [(("slos",), "", suite.slos)]
    at += [(("faults", n, "slos"), f"fault '{n}': ", f.slos) for n, f in suite.faults.items()]
    for base, what, slos in at:
        for metric, spec in slos.items():
            problem = slo_problem(metric, spec) or slo_unmeetable(metric, spec)
            if problem:
                raise smap.error(base + (metric,), f"slos: {problem}", obj=what.removesuffix(": ") or None)


def _check_fault_workloads(suite: Suite, smap: SourceMap) -> None:
    """Every fault can fire in the workload it runs with, under every framework (a planted fault needs one that
    calls the planted hooks; see :meth:`~chaosbench.injectors.base.Injector.check_workload`), and a ``role``
    target names a role that framework has."""
    from chaosbench.registry import FRAMEWORKS, INJECTORS, WORKLOADS

    for fw in suite.matrix.all_frameworks():
        spec = suite.workload_for(fw)
        wl = WORKLOADS.get(spec.name)
        steps = getattr(wl.Options.model_validate(spec.options), "steps", None)
        for name in sorted({n for names, _ in suite.matrix.cells(fw) for n in names}):
            fault = suite.faults[name]
            inj = INJECTORS.get(fault.injector)
            params = inj.Params.model_validate(fault.params)
            problem = inj.check_workload(wl, params)
            if problem is not None:
                raise smap.error(
                    ("faults", name, "injector"), f"{problem} (framework '{fw}')", obj=f"fault '{name}'"
                )
            never = _never_fires(fault.trigger, params, steps, suite.deadline_for([name]))
            if never is not None:
                raise smap.error(
                    ("faults", name) + never[0],
                    f"{never[1]}; this fault can never fire (framework '{fw}')",
                    obj=f"fault '{name}'",
                )
            role = fault.target.role
            roles = FRAMEWORKS.get(suite.framework_spec(fw).adapter or fw).roles
            if role is not None and role not in roles:
                raise smap.error(
                    ("faults", name, "target", "role"),
                    f"framework '{fw}' has no {role} (its roles: "
                    f"{', '.join(sorted(roles)) or 'none'}); run it under the frameworks that have one "
                    "(matrix.include)",
                    obj=f"fault '{name}'",
                )


def _never_fires(
    trigger: Trigger | None, params: BaseModel, steps: int | None, deadline_s: float
) -> tuple[Path_, str] | None:
    """Where and why a fault's trigger (or a planted fault's ``at_step``) lies beyond what its run can reach:
    a step after the workload's last (``steps``, when it has one), or a time after the run's deadline."""
    at: list[tuple[Path_, str, int | None]] = [
        (("params", "at_step"), "at_step", getattr(params, "at_step", None))
    ]
    if trigger is not None:
        at += [
            (("trigger", "at_step"), "at_step", trigger.at_step),
            (("trigger", "every_steps"), "every_steps", trigger.every_steps),
            (
                ("trigger", "on_event", "step"),
                "on_event.step",
                trigger.on_event.step if trigger.on_event else None,
            ),
        ]
        for key in ("after_s", "delay_s"):
            value = getattr(trigger, key)
            if value is not None and value >= deadline_s:
                return ("trigger", key), f"{key} {value:g}: the run's deadline is {deadline_s:g} s"
    for path, key, step in at:
        if steps is not None and isinstance(step, int) and step > steps:
            return path, f"{key} {step}: the workload runs {steps} steps"
    return None


def _check_phase_triggers(suite: Suite, smap: SourceMap) -> None:
    """An ``on_phase`` fault needs another fault in the same run (a matrix entry listing both) whose recovery it
    waits for; ``heal`` needs a framework whose groups heal (:attr:`~chaosbench.frameworks.base.Framework.heals`:
    TorchFT)."""
    from chaosbench.registry import FRAMEWORKS

    for names in suite.matrix.fault_names():
        for name in names:
            trig = suite.faults[name].trigger
            if trig is None or trig.on_phase is None:
                continue
            at: Path_ = ("faults", name, "trigger", "on_phase")
            if not [n for n in names if n != name]:
                raise smap.error(
                    at,
                    f"fault '{name}' fires on the {trig.on_phase} phase of another fault's recovery; "
                    f"run it with one (a matrix entry such as [first-fault, {name}])",
                )
            if trig.on_phase == "heal":
                for fw in suite.matrix.all_frameworks():
                    if names not in [c for c, _ in suite.matrix.cells(fw)]:
                        continue
                    if not FRAMEWORKS.get(suite.framework_spec(fw).adapter or fw).heals:
                        raise smap.error(
                            at,
                            f"fault '{name}' fires on the heal phase, which framework '{fw}' does "
                            "not have (only TorchFT's replica groups heal from a peer; run it under "
                            "TorchFT alone with matrix.include)",
                        )
