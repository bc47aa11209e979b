"""The suite's data model: the typed models a suite file is loaded into (:class:`Suite`, its faults, targets,
triggers, frameworks and workload), the runs it expands to (:class:`Scenario`) and the YAML source map that gives
each value its line. A leaf of the package: it names no plugin and no registry, so that the plugin bases can name
these types (:mod:`chaosbench.specs` loads a file into them and checks its plugin names and options).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    field_validator,
    model_validator,
)

from chaosbench.errors import SpecError
from chaosbench.rundir import dirname

Path_ = tuple[Any, ...]


# --------------------------------------------------------------------------- YAML with line numbers


def _index_lines(node: yaml.Node, path: Path_, out: dict[Path_, int]) -> None:
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            # A key's own line is where a user looks for a problem with its value.
            out[path + (key,)] = key_node.start_mark.line + 1
            _index_lines(value_node, path + (key,), out)
            out[path + (key,)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_lines(item, path + (i,), out)


@dataclass
class SourceMap:
    """Where each YAML path of a loaded document lies: ``line(("faults", "kill", "trigger"))``."""

    file: str
    lines: dict[Path_, int] = field(default_factory=dict)

    def line(self, path: Path_) -> int:
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), 1)

    def where(self, path: Path_) -> str:
        return f"{self.file}:{self.line(path)}"

    def error(self, path: Path_, problem: str, obj: str | None = None) -> SpecError:
        """A :class:`SpecError` about ``obj`` (the user's object, e.g. ``fault 'kill-rank1'``) at ``path``'s line."""
        return SpecError(problem, file=self.file, line=self.line(path), obj=obj)


def load_yaml(path: str | Path) -> tuple[Any, SourceMap]:
    """Load a YAML file and map every path in it to its line. Syntax errors raise :class:`SpecError`."""
    p = Path(path)
    shown = str(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read suite: {exc.strerror or exc}", file=shown) from None
    return load_yaml_text(text, shown)


def load_yaml_text(text: str, shown: str) -> tuple[Any, SourceMap]:
    smap = SourceMap(shown)
    loader = yaml.SafeLoader(text)
    try:  # one parse: the node tree (its marks give the lines) and the data constructed from it
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise SpecError(f"invalid YAML: {exc.problem or exc}", file=shown, line=line) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"invalid YAML: {exc}", file=shown) from None
    finally:
        loader.dispose()
    if node is not None:
        _index_lines(node, (), smap.lines)
    return data, smap


# --------------------------------------------------------------------------- models


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


#: The processes a fault can target by what they do, each resolved by the framework adapter that has it
#: (:attr:`~chaosbench.frameworks.base.Framework.roles`).
ROLES = ("rank0", "agent", "rendezvous-host", "lighthouse", "bridge", "head", "node", "driver")


class Target(_Strict):
    """Which ranks a fault hits: ``rank`` (a number or ``random``, drawn from the suite's seed), ``ranks``
    (a list), ``node`` (every rank on that node, e.g. ``node1``, or ``random``) or ``all``. Shorthands:
    ``target: 1``, ``target: random``, ``target: [0, 1]``, ``target: all``. Or a process by its ``role``
    (:data:`ROLES`: rank 0, a launcher agent, the process that hosts the rendezvous store, TorchFT's
    Lighthouse, nvrx's bridge of a rank to its rank monitor, Ray's head node, a Ray worker node's ``ray start``,
    the Ray Train driver), with ``node`` choosing among several (an agent per node; default: the first)."""

    rank: int | Literal["random"] | None = None
    ranks: list[int] | None = None
    node: str | None = None
    all: bool = False
    role: (
        Literal["rank0", "agent", "rendezvous-host", "lighthouse", "bridge", "head", "node", "driver"] | None
    ) = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        if v == "all":
            return {"all": True}
        if isinstance(v, int | str) and not isinstance(v, bool):
            return {"rank": v}
        if isinstance(v, list):
            return {"ranks": v}
        return v

    @model_validator(mode="after")
    def _one_kind(self) -> Target:
        given = [k for k in ("rank", "ranks", "node") if getattr(self, k) is not None] + (
            ["all"] if self.all else []
        )
        if self.role is not None:
            if [g for g in given if g != "node"]:
                raise ValueError(f"role takes node only (got {', '.join(given)})")
            return self
        if len(given) > 1:
            raise ValueError(f"give one of rank, ranks, node, all, role (got {', '.join(given)})")
        if not given:
            self.rank = "random"
        for r in ([self.rank] if isinstance(self.rank, int) else []) + (self.ranks or []):
            if r < 0:
                raise ValueError("rank must be >= 0")
        if self.ranks is not None and not self.ranks:
            raise ValueError("ranks is empty")
        return self

    def rank_numbers(self) -> list[int]:
        """The rank numbers named explicitly (for validation against the job's size)."""
        return ([self.rank] if isinstance(self.rank, int) else []) + list(self.ranks or [])

    def describe(self) -> str:
        if self.role is not None:
            return f"the {self.role}" + (f" of {self.node}" if self.node else "")
        if self.all:
            return "all ranks"
        if self.node is not None:
            return f"node {self.node}"
        if self.ranks is not None:
            return f"ranks {self.ranks}"
        return f"rank {self.rank}"


class EventMatch(_Strict):
    """A timeline event that fires a trigger: its ``kind`` and optional field values it must have."""

    kind: str
    step: int | None = None
    rank: int | None = None
    incarnation: int | None = None

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, v: str) -> str:
        from chaosbench.timeline import EventKind

        known = {k.value for k in EventKind}
        if v not in known:
            raise ValueError(f"unknown event kind '{v}' (known: {', '.join(sorted(known))})")
        return v


class Poisson(_Strict):
    """Fault arrivals as a Poisson process with mean time between faults ``mtbf_s``, from the first step,
    drawn from the run's seed (the same seed replays the same schedule)."""

    mtbf_s: float = Field(gt=0)


#: A recovery phase -> the timeline events that begin it (any of them, after another fault of the run fired):
#: a framework's first reaction; its relaunch of the job or a group; a rank's checkpoint load in a new
#: incarnation; a TorchFT group's heal from a peer; a new incarnation forming its process group (an elastic
#: agent's rendezvous, or a relaunched rank starting).
RECOVERY_PHASES: dict[str, tuple[str, ...]] = {
    "detect": ("detect",),
    "restart": ("restart",),
    "restore": ("ckpt_load_begin",),
    "heal": ("heal_begin",),
    "rendezvous": ("rendezvous", "rank_start"),
}


class Trigger(_Strict):
    """When a fault fires. Exactly one condition:

    - ``at_step: N``: once step N has completed;
    - ``after_s: T``: T seconds after the first completed step (a serving run: after its load started);
    - ``on_event: {kind, step?, rank?, incarnation?}``: when such an event appears (e.g. ``ckpt_save_begin``
      for a fault during a checkpoint; ``rank_start`` with ``incarnation: 1`` for the start of incarnation 1);
    - ``every_steps: N``: after step N, 2N, 3N, ... (of any incarnation, each index once);
    - ``poisson: {mtbf_s: M}``: random arrivals with mean spacing M seconds;
    - ``on_phase: detect | restart | restore | heal | rendezvous``: when the recovery from another fault of the
      same run reaches that phase (:data:`RECOVERY_PHASES`: the timeline events that mark it, for every
      framework), for a fault that lands while the first one is being recovered.

    ``delay_s`` waits that long after the condition; ``max_fires`` caps the number of firings (default 1
    for the one-shot conditions, unlimited for ``every_steps`` and ``poisson``)."""

    at_step: int | None = Field(default=None, ge=1)
    after_s: float | None = Field(default=None, ge=0)
    on_event: EventMatch | None = None
    every_steps: int | None = Field(default=None, ge=1)
    poisson: Poisson | None = None
    on_phase: Literal["detect", "restart", "restore", "heal", "rendezvous"] | None = None
    delay_s: float = Field(default=0.0, ge=0)
    max_fires: int | None = Field(default=None, ge=1)

    CONDITIONS: ClassVar[tuple[str, ...]] = (
        "at_step",
        "after_s",
        "on_event",
        "every_steps",
        "poisson",
        "on_phase",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> Trigger:
        given = [k for k in self.CONDITIONS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(self.CONDITIONS)}")
        return self

    @property
    def repeating(self) -> bool:
        return self.every_steps is not None or self.poisson is not None

    @property
    def fire_limit(self) -> int | None:
        return self.max_fires if self.max_fires is not None else (None if self.repeating else 1)

    def describe(self) -> str:
        if self.at_step is not None:
            return f"at step {self.at_step}"
        if self.after_s is not None:
            return f"{self.after_s} s after first step"
        if self.on_event is not None:
            return f"on {self.on_event.kind}"
        if self.on_phase is not None:
            return f"on the {self.on_phase} phase of another fault's recovery"
        if self.every_steps is not None:
            return f"every {self.every_steps} steps"
        assert self.poisson is not None
        return f"poisson mtbf {self.poisson.mtbf_s} s"


class Bound(_Strict):
    """A numeric service-level objective: ``max`` and/or ``min`` (inclusive)."""

    max: float | None = None
    min: float | None = None

    @model_validator(mode="after")
    def _some(self) -> Bound:
        if self.max is None and self.min is None:
            raise ValueError("give max and/or min")
        return self


#: metric name -> a bound, or a value the metric must equal (``fidelity: exact``, ``detected: true``).
Slos = dict[str, Bound | bool | float | str]


def slos_as_data(slos: Slos) -> dict[str, Any]:
    """The SLOs as plain data, as a suite file writes them (bounds without their unset ends)."""
    return {k: (v.model_dump(exclude_none=True) if isinstance(v, BaseModel) else v) for k, v in slos.items()}


def _check_slo_names(v: dict[str, Any]) -> dict[str, Any]:
    from chaosbench.analysis.metrics import metric_names

    known = set(metric_names())
    for name in v:
        if name not in known:
            raise ValueError(f"unknown metric '{name}' (known: {', '.join(sorted(known))})")
    return v


def _slo_kind(metric: str) -> str:
    """What a metric's values are: ``bool``, ``str``, ``number`` or ``other`` (from RunMetrics' fields)."""
    import typing

    from chaosbench.analysis.metrics import RunMetrics

    hint = str(typing.get_type_hints(RunMetrics).get(metric, ""))
    return next(
        (
            k
            for k, ts in (("bool", ("bool",)), ("str", ("str |",)), ("number", ("float", "int")))
            if hint.startswith(ts)
        ),
        "other",
    )


def slo_problem(metric: str, spec: Any) -> str | None:
    """What is wrong with an SLO's value for its metric's type: a boolean metric takes true or false, a text
    metric a non-empty text, a numeric one a number or a bound (a boolean is not a number). None when fine."""
    kind = _slo_kind(metric)
    if kind == "bool" and not isinstance(spec, bool):
        return f"{metric} is true or false: give true or false (got {_shown(spec)})"
    if kind == "str" and not (isinstance(spec, str) and spec.strip()):
        return f"{metric} is a text: give a non-empty value such as {_SLO_EXAMPLES.get(metric, 'a value')} (got {_shown(spec)})"
    if kind == "number" and (isinstance(spec, bool | str)):
        return f"{metric} is a number: give a number or a bound such as {{max: 30}} (got {_shown(spec)})"
    return None


#: Metrics that are never negative (durations, lost work, counts), and shares (0 to 1).
_NEVER_NEGATIVE = (
    "time_to_",
    "lost_",
    "badput_",
    "stage_",
    "latency_",
    "checkpoint_",
    "capacity_lost_",
    "restart_count",
    "fault_count",
    "skipped_steps",
    "false_detections",
    "requests",
    "failed_requests",
    "retried_requests",
    "replicas",
)
_SHARES = ("goodput", "error_rate", "capacity_lost_share", "throughput_during_share")


def slo_unmeetable(metric: str, spec: Any) -> str | None:
    """Why no run can meet an SLO (its bounds cross, or lie where the metric never is), or None."""
    if isinstance(spec, bool) or not isinstance(spec, int | float | Bound):
        return None
    lo, hi = (spec, spec) if not isinstance(spec, Bound) else (spec.min, spec.max)
    shown = _shown(spec)
    if lo is not None and hi is not None and lo > hi:
        return f"{metric} {shown}: min is above max; no run can meet it"
    if metric.startswith(_NEVER_NEGATIVE) or metric in _SHARES:
        if hi is not None and hi < 0:
            return f"{metric} {shown}: {metric} is never negative; no run can meet it"
    if metric in _SHARES and lo is not None and lo > 1:
        return f"{metric} {shown}: {metric} is a share, at most 1; no run can meet it"
    return None


_SLO_EXAMPLES = {"outcome": "recovered", "fidelity": "exact", "checkpoint_outcome": "fell_back"}


def _shown(v: Any) -> str:
    return repr(v.model_dump(exclude_none=True)) if isinstance(v, BaseModel) else repr(v)


class FaultSpec(_Strict):
    """One fault: which injector, where, when, with which injector parameters."""

    injector: str
    target: Target = Field(default_factory=Target)
    trigger: Trigger | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    description: str | None = None
    use: str | None = Field(default=None, exclude=True)  # resolved by load_suite (faults/NAME.yaml)
    slos: Slos = Field(default_factory=dict, description="SLOs for runs of this fault (override the suite's)")
    deadline_s: float | None = Field(
        default=None,
        gt=0,
        description="the deadline of this fault's runs, instead of defaults.deadline_s (a fault the framework is "
        "not meant to survive need not wait out the suite's); a run of several faults gets the longest of theirs",
    )

    @field_validator("slos")
    @classmethod
    def _slo_names(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _check_slo_names(v)


class FrameworkSpec(BaseModel):
    """A framework configuration; ``adapter`` defaults to its key in the suite, other keys are options.
    ``workload`` overrides the suite's workload for this framework (e.g. ``{name: ft-mlp}`` for torchft): a
    different ``name`` keeps only ``ranks`` and ``nodes`` of the default, the same name merges the options."""

    model_config = ConfigDict(extra="allow")
    adapter: str | None = None
    workload: dict[str, Any] | None = None
    runtime_options: dict[str, Any] | None = Field(
        default=None,
        description="runtime options for this framework's runs, merged over the suite's defaults "
        "(e.g. a hot spare: {spare_nodes: 1, lost_node: spare} on docker)",
    )
    strategy: Literal["restart-in-place", "hot-spare", "shrink", "continue"] | None = Field(
        default=None,
        description="the recovery strategy this configuration stands for (elasticity reports "
        "compare strategies per workload): restart-in-place once the node is back, a hot spare takes the lost "
        "node's place, shrink (re-form on fewer nodes and reshard), continue without the lost replica (TorchFT)",
    )

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class WorkloadSpec(BaseModel):
    """The training program: a registered workload name, the number of ranks, and its options."""

    model_config = ConfigDict(extra="allow")
    name: str = "ddp-mlp"
    ranks: int = Field(default=2, ge=1, description="world size")
    nodes: int = Field(default=1, ge=1, description="nodes the ranks are spread over (ranks / nodes each)")

    @model_validator(mode="after")
    def _divisible(self) -> WorkloadSpec:
        if self.ranks % self.nodes:
            raise ValueError(f"ranks ({self.ranks}) must be a multiple of nodes ({self.nodes})")
        return self

    @property
    def ranks_per_node(self) -> int:
        return self.ranks // self.nodes

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class Defaults(_Strict):
    runtime: str = "local"
    runtime_options: dict[str, Any] = Field(default_factory=dict, description="options of the runtime")
    deadline_s: float = Field(default=300.0, gt=0)
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)


def schedules(faults: list[str | list[str]]) -> list[list[str]]:
    return [[f] if isinstance(f, str) else list(f) for f in faults]


class UntilDecided(_Strict):
    """``repeats: {max: N, until: decided}``: repeat a scenario until its verdict can no longer change, at most
    ``max`` times and at least ``min`` (default 2, or ``max`` when smaller). The stopping rule and how alpha is
    spent over the looks: :mod:`chaosbench.analysis.sequential`. Without a baseline (``--baseline``) and without
    SLOs nothing can be decided: the scenario runs ``max`` repeats."""

    max: int = Field(ge=1, description="the most repeats")
    until: Literal["decided"] = Field(
        description="stop once the verdict against the baseline and the SLOs is settled"
    )
    min: int | None = Field(default=None, ge=1, description="the fewest repeats (default 2, at most max)")

    @model_validator(mode="after")
    def _min_at_most_max(self) -> UntilDecided:
        if self.min is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self

    @property
    def min_repeats(self) -> int:
        return self.min if self.min is not None else min(2, self.max)

    @property
    def looks(self) -> int:
        """How many times the verdict is looked at: after each repeat from ``min`` to ``max``."""
        return self.max - self.min_repeats + 1


def _repeats_kind(v: Any) -> str:
    return "until-decided" if isinstance(v, dict | UntilDecided) else "fixed-repeats"


#: A cell's repeats: a fixed number, or until decided (:class:`UntilDecided`); a mapping is read as the latter
#: (its errors name its own fields, not the number's).
Repeats = Annotated[
    Annotated[int, Field(ge=1), Tag("fixed-repeats")] | Annotated[UntilDecided, Tag("until-decided")],
    Discriminator(_repeats_kind),
]
#: Tags of a tagged union (:data:`Repeats`), left out of a field's path in an error.
UNION_TAGS = ("fixed-repeats", "until-decided")


def repeats_bound(repeats: Repeats) -> int:
    """The most runs ``repeats`` can make: the number, or ``max``."""
    return repeats if isinstance(repeats, int) else repeats.max


class MatrixPart(_Strict):
    """More runs beside the cross product: these frameworks x these faults (faults that only some frameworks
    have a use for: a kill during TorchFT's heal, the Lighthouse's loss)."""

    frameworks: list[str] = Field(min_length=1)
    faults: list[str | list[str]] = Field(min_length=1)
    repeats: Repeats | None = Field(default=None, description="default: the matrix's")


class Matrix(_Strict):
    """``faults`` entries are fault names, or lists of names: a schedule of several faults in one run. Every
    framework runs every entry; ``include`` adds runs of some frameworks only."""

    frameworks: list[str] = Field(min_length=1)
    faults: list[str | list[str]] = Field(default_factory=list)
    repeats: Repeats = Field(default=1, description="a number, or {max: N, until: decided} (and min)")
    include: list[MatrixPart] = Field(default_factory=list)

    def fault_names(self) -> list[list[str]]:
        """Every fault schedule of the matrix, ``include`` parts' too (each once)."""
        out = schedules(self.faults)
        for part in self.include:
            out += [names for names in schedules(part.faults) if names not in out]
        return out

    def all_frameworks(self) -> list[str]:
        """The frameworks of the cross product, then those only ``include`` parts name."""
        out = list(self.frameworks)
        for part in self.include:
            out += [fw for fw in part.frameworks if fw not in out]
        return out

    def cells(self, framework: str) -> list[tuple[list[str], Repeats]]:
        """The fault schedules ``framework`` runs, each with its repeats."""
        out: list[tuple[list[str], Repeats]] = []
        if framework in self.frameworks:
            out += [(names, self.repeats) for names in schedules(self.faults)]
        for part in self.include:
            if framework in part.frameworks:
                out += [(names, part.repeats or self.repeats) for names in schedules(part.faults)]
        return out


class Projection(_Strict):
    """Fleet scale and assumptions of the report's goodput projection (job MTBF = node MTBF / nodes); see
    :mod:`chaosbench.analysis.fleet` for what is measured and what is assumed."""

    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(default=8, ge=1)
    node_mtbf_h: float = Field(gt=0)
    horizon_days: float = Field(default=30.0, gt=0)
    trials: int = Field(default=200, ge=1)
    recovery_scale: float = Field(
        default=1.0, gt=0, description="multiply measured recovery (fleet restarts cost more)"
    )
    checkpoint_cost_s: float | None = Field(
        default=None,
        gt=0,
        description="the fleet's checkpoint cost (default: chaosbench.analysis.fleet.DEFAULT_CHECKPOINT_COST_S)",
    )
    checkpoint_interval_s: float | None = Field(
        default=None, gt=0, description="the fleet's checkpoint interval (default: the Young/Daly optimum)"
    )
    manual_recovery_s: float | None = Field(
        default=None,
        gt=0,
        description="cost of a failure the framework did not recover from (default: 20 min)",
    )
    fault_mix: dict[Literal["crash", "node", "hang", "sdc"], float] | None = Field(
        default=None,
        description="relative frequency of each fault class (default: Llama 3's interruption causes)",
    )
    node_repair_s: float | None = Field(
        default=None,
        gt=0,
        description="time a lost node takes to come back (elasticity: spare pools; default: "
        "chaosbench.analysis.fleet.DEFAULT_NODE_REPAIR_S)",
    )
    spare_pools: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None,
        description="spare-pool sizes (nodes) the elasticity report projects (default: "
        "chaosbench.analysis.fleet.DEFAULT_SPARE_POOLS)",
    )


#: A name that is also a directory name (a suite's results go to ``OUT/<name>/``).
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class Suite(_Strict):
    """A whole suite file. ``control``: run one fault-free control per framework (needed for fidelity and
    extra wall time). ``name`` is the results' directory name: letters, digits, ``.``, ``_``, ``-``, not
    starting with ``.``/``_``/``-``, at most 100 characters."""

    name: str = Field(json_schema_extra={"pattern": SAFE_NAME.pattern})
    description: str | None = None
    seed: int = 0
    control: bool = True
    defaults: Defaults = Field(default_factory=Defaults)
    frameworks: dict[str, FrameworkSpec] = Field(default_factory=dict)
    faults: dict[str, FaultSpec] = Field(default_factory=dict)
    matrix: Matrix
    projection: Projection | None = None
    slos: Slos = Field(default_factory=dict, description="SLOs every fault run must meet")
    keep_checkpoints: Literal["failed", "all", "none"] = Field(
        default="failed",
        description="which runs keep their checkpoint files once they end: failed (runs that did not recover, "
        "or diverged from their control), all, none; the names and sizes are recorded either way",
    )

    @field_validator("slos")
    @classmethod
    def _slo_names(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _check_slo_names(v)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        if not SAFE_NAME.fullmatch(v):
            raise ValueError(
                f"{v!r} is not usable as a directory name (give letters, digits, '.', '_', '-', "
                "starting with a letter or digit, at most 100 characters)"
            )
        return v

    @field_validator("frameworks", "faults")
    @classmethod
    def _named(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key in v:
            if not isinstance(key, str) or not key.strip():
                raise ValueError(f"{key!r} is not a name (give a non-empty name)")
        return v

    # Not part of the YAML: where the suite was loaded from (set by suite_from_data), and the directory chaosbench
    # was started in when it was loaded ({project_dir} of a command workload).
    _source: str = PrivateAttr(default="<suite>")
    _smap: SourceMap | None = PrivateAttr(default=None)
    _project_dir: str = PrivateAttr(default_factory=lambda: str(Path.cwd()))

    @property
    def source(self) -> str:
        """The suite file (``<suite>`` for a suite given as text)."""
        return self._source

    @property
    def project_dir(self) -> str:
        """The directory chaosbench was started in when the suite was loaded."""
        return self._project_dir

    def set_source(self, file: str, smap: SourceMap | None = None) -> None:
        self._source = file
        self._smap = smap

    def where(self, path: Path_) -> str:
        """``file:line`` of a place in the suite file (the file alone for a suite without a source map)."""
        return self._smap.where(path) if self._smap is not None else self.source

    def framework_where(self, label: str) -> str:
        """``file:line`` of a framework configuration: its entry in ``frameworks``, else the matrix's."""
        return self.where(("frameworks", label) if label in self.frameworks else ("matrix", "frameworks"))

    @property
    def suite_dir(self) -> str:
        """The directory of the suite file ({suite_dir} of a command workload)."""
        return str(Path(self.source).resolve().parent) if self.source != "<suite>" else self.project_dir

    def scenarios(self) -> list[Scenario]:
        """Controls first (one per framework), then every framework x fault schedule x repeat. Builds them all:
        check :meth:`run_count` against a limit first (a typo such as ``repeats: 100000000``)."""
        return list(self.iter_scenarios())

    def iter_scenarios(self) -> Iterator[Scenario]:
        """:meth:`scenarios` one at a time, in order."""
        for fw, names, repeats in self.cells():
            for rep in range(repeats):
                yield self.scenario(fw, names, rep)

    def cells(self) -> list[tuple[str, list[str], int]]:
        """Every (framework, fault schedule, repeats) of the suite in run order; a control is ``(fw, [], 1)``.
        A cell repeated until decided counts its ``max`` (:meth:`until_decided` says which)."""
        out: list[tuple[str, list[str], int]] = []
        for fw in self.matrix.all_frameworks():
            if self.control:
                out.append((fw, [], 1))
            out += [(fw, names, repeats_bound(repeats)) for names, repeats in self.matrix.cells(fw)]
        return out

    def until_decided(self) -> dict[str, UntilDecided]:
        """Scenario id (``framework/fault``) -> its design, for every cell repeated until decided."""
        out: dict[str, UntilDecided] = {}
        for fw in self.matrix.all_frameworks():
            for names, repeats in self.matrix.cells(fw):
                if isinstance(repeats, UntilDecided):
                    out[f"{fw}/{'+'.join(names)}"] = repeats
        return out

    def run_count(self) -> int:
        """How many runs the suite makes at most (without building them): a cell repeated until decided counts
        its ``max``."""
        return sum(repeats for _, _, repeats in self.cells())

    def wall_bound_s(self, per_run_overhead_s: float, jobs: int = 1) -> float:
        """An upper bound of the suite's wall time: every run reaching its deadline (:meth:`deadline_for`), plus
        ``per_run_overhead_s`` for setting it up and tearing it down. One run at a time, their sum; ``jobs`` at
        once, at most ceil(runs / jobs) of the longest (a busy slot ends its run within that and takes the next)."""
        runs = [
            (self.deadline_for(names) + per_run_overhead_s, repeats) for _, names, repeats in self.cells()
        ]
        total = sum(each * repeats for each, repeats in runs)
        longest = max((each for each, _ in runs), default=0.0)
        return min(total, math.ceil(self.run_count() / jobs) * longest)

    def deadline_for(self, names: list[str]) -> float:
        """The deadline of a run of the faults ``names`` (none: a control): the longest of their ``deadline_s``,
        a fault without one counting ``defaults.deadline_s``."""
        if not names:
            return self.defaults.deadline_s
        return max(self.faults[n].deadline_s or self.defaults.deadline_s for n in names)

    def framework_spec(self, label: str) -> FrameworkSpec:
        return self.frameworks.get(label) or FrameworkSpec()

    def workload_for(self, label: str) -> WorkloadSpec:
        """The workload a framework runs: the suite's, or its own override (see :class:`FrameworkSpec`)."""
        over = self.framework_spec(label).workload
        base = self.defaults.workload
        if not over:
            return base
        if over.get("name", base.name) == base.name:
            merged = {**base.model_dump(), **over}
        else:
            merged = {"ranks": base.ranks, "nodes": base.nodes, **over}
        return WorkloadSpec.model_validate(merged, strict=True)

    def scenario(self, fw: str, names: list[str], repeat: int) -> Scenario:
        """The run of framework ``fw`` with the faults ``names`` (none: the control), repeat ``repeat``."""
        fault = "+".join(names) or None
        digest = hashlib.sha256(f"{self.seed}:{fw}:{fault}:{repeat}".encode()).hexdigest()
        fspec = self.framework_spec(fw)
        slos: dict[str, Any] = dict(self.slos)
        for n in names:
            slos.update(self.faults[n].slos)
        return Scenario(
            suite=self.name,
            framework_label=fw,
            adapter=fspec.adapter or fw,
            framework_options=fspec.options,
            fault_name=fault,
            fault=self.faults[names[0]] if names else None,
            repeat=repeat,
            seed=self.seed,
            rng_seed=int(digest[:12], 16),
            workload=self.workload_for(fw),
            runtime=self.defaults.runtime,
            runtime_options={**self.defaults.runtime_options, **(fspec.runtime_options or {})},
            deadline_s=self.deadline_for(names),
            strategy=fspec.strategy,
            faults=tuple((n, self.faults[n]) for n in names),
            slos=slos,
            project_dir=self.project_dir,
            suite_dir=self.suite_dir,
        )


@dataclass(frozen=True)
class Scenario:
    """One run to make: a framework configuration, a fault (None for the control) and a repeat index."""

    suite: str
    framework_label: str
    adapter: str
    framework_options: dict[str, Any]
    fault_name: str | None
    fault: FaultSpec | None
    repeat: int
    seed: int
    rng_seed: int
    workload: WorkloadSpec
    runtime: str
    deadline_s: float
    faults: tuple[tuple[str, FaultSpec], ...] = ()
    runtime_options: dict[str, Any] = field(default_factory=dict)
    slos: dict[str, Any] = field(default_factory=dict)
    project_dir: str = "."
    suite_dir: str = "."
    strategy: str | None = None

    @property
    def control(self) -> bool:
        return self.fault is None

    @property
    def id(self) -> str:
        return f"{self.framework_label}/{self.fault_name or 'control'}"

    @property
    def dirname(self) -> str:
        return dirname(self.id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "scenario": self.id,
            "framework": self.framework_label,
            "adapter": self.adapter,
            "framework_options": self.framework_options,
            "fault": self.fault_name,
            "fault_spec": self.fault.model_dump() if self.fault else None,
            "faults": [{"name": n, **f.model_dump()} for n, f in self.faults],
            "slos": slos_as_data(self.slos),
            "repeat": self.repeat,
            "control": self.control,
            "seed": self.seed,
            "rng_seed": self.rng_seed,
            "workload": self.workload.model_dump(),
            "runtime": self.runtime,
            "runtime_options": self.runtime_options,
            "strategy": self.strategy,
            "deadline_s": self.deadline_s,
            "project_dir": self.project_dir,
            "suite_dir": self.suite_dir,
        }


# --------------------------------------------------------------------------- loading and validation
