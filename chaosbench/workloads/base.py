"""The workload interface: the training program and how one rank of it is started."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

from chaosbench.plugin_options import adopt_model

if TYPE_CHECKING:
    from chaosbench.spec_model import WorkloadSpec
    from chaosbench.workloads.skeleton import TrainingOptions


@dataclass(frozen=True)
class RunPaths:
    """What a workload needs to know about the run it trains in: where it is, where its checkpoints go, its
    seed, and the user's directories (for a command workload's placeholders)."""

    run_dir: Path
    ckpt_dir: Path
    seed: int
    project_dir: str = "."
    suite_dir: str = "."


class NoOptions(BaseModel):
    """The options of a workload that takes none."""

    model_config = ConfigDict(extra="forbid")


#: A workload's options model: ``class CommandWorkload(Workload[CommandOptions])`` makes ``self.options`` a CommandOptions.
O = TypeVar("O", bound=BaseModel)  # noqa: E741 - the options' type parameter, as in the issue's Framework[O]


class Workload(ABC, Generic[O]):
    """A training program, typed by its options model ``O`` (``class CommandWorkload(Workload[CommandOptions])``:
    that model is its ``Options`` and ``self.options`` an instance of it). Every rank runs the same ``argv``; its rank comes from the environment
    (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), set by the framework adapter."""

    name: ClassVar[str]
    #: Whether the program calls the planted faults' hooks (:mod:`chaosbench.workloads.planted`), so that a
    #: planted fault (crash-loop, sdc, segfault, ...) can fire in it.
    plants: ClassVar[bool] = False
    #: The changes the program can make to its own gradient collective for a planted ``collective-hang``
    #: (``skip``: leave it out, ``shape``: one element fewer, ``op``: MAX for SUM).
    desyncs: ClassVar[frozenset[str]] = frozenset()
    #: Whether the program checkpoints into the run's checkpoint directory (a fault that poisons a checkpoint
    #: needs one).
    checkpoints: ClassVar[bool] = False
    #: Whether the program's checkpoints go through the training skeleton's :class:`~chaosbench.workloads.skeleton.
    #: Checkpoints`, so that a launcher running it inside its own worker can keep them and choose the one to
    #: resume from (:class:`~chaosbench.workloads.skeleton.CheckpointBridge`: Ray Train's ``ray.train.report``).
    bridged_checkpoints: ClassVar[bool] = False
    #: Whether the program is a server (replicas answering requests), not a trainer: what a load-balancer
    #: framework runs.
    serves: ClassVar[bool] = False
    #: Whether the program is the user's own script, whose inside chaosbench does not know (it may train through
    #: TorchFT's Manager without declaring :meth:`replica_groups`).
    users_script: ClassVar[bool] = False

    #: The options model: the type argument ``O`` (set from it when a subclass is made), or one set explicitly.
    Options: ClassVar[type[BaseModel]] = NoOptions

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        adopt_model(cls, Workload, "Options")

    def __init__(self, spec: WorkloadSpec, options: O) -> None:
        self.spec = spec
        self.options: O = options

    @abstractmethod
    def argv(self, run: RunPaths) -> list[str]:
        """The full command line of one rank (first element: the executable).

        Args:
            run: Where the run is, its checkpoint directory, seed and the user's directories.

        Returns:
            The argv every rank runs (the rank itself comes from the environment).
        """

    def env(self, run: RunPaths) -> dict[str, str]:
        """Extra environment for every rank.

        Args:
            run: Where the run is, its checkpoint directory, seed and the user's directories.

        Returns:
            Variable -> value, added to every rank's environment; empty by default.
        """
        return {}

    @property
    def pg_timeout_s(self) -> float | None:
        """The process-group timeout the workload sets, when known (a detection knob)."""
        return None

    def replica_groups(self) -> int | None:
        """Replica groups of a workload that trains through TorchFT's Manager; None: it does not.

        Returns:
            The number of replica groups; None when the workload does not train through TorchFT (the default).
        """
        return None

    @property
    def total_steps(self) -> int | None:
        """The optimizer steps the program trains for, when known; None: unknown (the default)."""
        return None

    def watched_dirs(self, run: RunPaths) -> list[Path]:
        """Directories whose new checkpoint files the harness reports as saves (the program prints none of its
        own): :mod:`chaosbench.workloads.checkpoint_watch`. Built-in programs report their saves themselves.

        Args:
            run: Where the run is, its checkpoint directory, seed and the user's directories.

        Returns:
            The directories to watch; empty by default.
        """
        return []

    def final_artifact(self, run: RunPaths) -> str | None:
        """A file, directory or glob holding the program's final state, digested when the run ends (for
        fidelity, when the program prints no digest of its own); None: its ``train_end`` carries the digest.

        Args:
            run: Where the run is, its checkpoint directory, seed and the user's directories.

        Returns:
            The path or glob of the final state; None (the default) when ``train_end`` carries the digest.
        """
        return None


class ServingWorkload(Workload[O]):
    """A server, not a trainer: every rank is a replica answering HTTP requests on the port its framework gives
    it (``SERVE_HOST``/``SERVE_PORT`` in its environment), and a load program drives them through the framework's
    balancer (the ``balancer`` adapter runs any subclass). A replica says ``rank_start`` and, once it answers,
    ``replica_ready``; the load writes ``load_start``, ``load_window`` and ``load_end``."""

    serves: ClassVar[bool] = True

    def init_argv(self, run: RunPaths) -> list[str] | None:
        """A process run once before the replicas start (the built-in ``serve`` writes its model file); None: none.

        Args:
            run: Where the run is, its checkpoint directory, seed and the user's directories.
        """
        return None

    @property
    def health_path(self) -> str:
        """The path the balancer's health checks GET (``/health``)."""
        return "/health"

    @property
    def health_status(self) -> int | None:
        """The status a passed health check answers; None: haproxy's default (any 2xx or 3xx)."""
        return None

    @abstractmethod
    def load_argv(self, target_url: str, allow_cidrs: Sequence[str] = ()) -> list[str]:
        """The load process against ``target_url`` (``http://host:port``, the balancer's frontend).

        Args:
            target_url: Where the load sends its requests.
            allow_cidrs: Networks besides loopback the target may be in (the docker runtime's internal network).
        """


class ProgramWorkload(Workload[O]):
    """A built-in training program run as ``python -m <program>``: its argv comes from its Options model (see
    :func:`chaosbench.workloads.skeleton.options_argv`). ``checkpoints``: the program checkpoints into the run's
    checkpoint directory (``--ckpt-dir``)."""

    program: ClassVar[str]
    checkpoints: ClassVar[bool] = True
    plants: ClassVar[bool] = True

    def argv(self, run: RunPaths) -> list[str]:
        from chaosbench.workloads.skeleton import workload_argv

        return workload_argv(self.program, self.options, run.seed, run.ckpt_dir if self.checkpoints else None)


#: The options of a program built on the training skeleton: a :class:`~chaosbench.workloads.skeleton.TrainingOptions`.
TO = TypeVar("TO", bound="TrainingOptions")


class TrainingProgram(ProgramWorkload[TO]):
    """A built-in program whose options are the skeleton's TrainingOptions, whose ``steps`` and ``pg_timeout_s``
    the harness reads too (ddp-mlp, fsdp-lm, pp-lm)."""

    @property
    def pg_timeout_s(self) -> float | None:
        return float(self.options.pg_timeout_s)

    @property
    def total_steps(self) -> int | None:
        return int(self.options.steps)
