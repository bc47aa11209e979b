"""The ``serve`` workload: N replicas of a small torch model, each an HTTP server, driven by locust load.

A serving run has three programs (a framework such as ``balancer`` plans them and puts a load balancer in front
of the replicas):

- the model writer, once before the replicas (:meth:`Serve.init_argv`): ``python -m
  chaosbench.workloads.serve_replica --init-model ...`` writes ``<ckpt_dir>/model.pt`` (:meth:`Serve.model_file`),
  a ``torch.save`` of the model's state dict, atomically and between ``ckpt_save_begin``/``ckpt_save_end``;
- one replica per rank (:meth:`Serve.argv`): loads that file and serves it on ``SERVE_HOST:SERVE_PORT``
  (:mod:`chaosbench.workloads.serve_replica`, the endpoints and events are documented there);
- the load (:meth:`Serve.load_argv`): locust users against the balancer's URL for ``load.duration_s``,
  results per ``load.window_ms`` on the timeline (:mod:`chaosbench.workloads.serve_load`).

``ranks`` is the number of replicas. There are no training steps (:attr:`Serve.total_steps` is None): the run
is complete when the load program exits 0. Standard library and pydantic at import.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from chaosbench.workloads.base import RunPaths, ServingWorkload

#: The replica program and the load program, as ``python -m`` runs them.
REPLICA_PROGRAM = "chaosbench.workloads.serve_replica"
LOAD_PROGRAM = "chaosbench.workloads.serve_load"
#: The model file's name in the run's checkpoint directory (``file_glob: model.pt`` for corrupt-checkpoint).
MODEL_FILE_NAME = "model.pt"
#: The endpoints a request mix may name: ``POST /predict``, ``GET /health``, ``GET /info``.
ENDPOINTS = ("predict", "health", "info")
#: The methods a declared request may use.
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


class LoadShape(BaseModel):
    """What every load has, whatever its requests: how many users, how fast they start, for how long, and the
    bounds."""

    model_config = ConfigDict(extra="forbid")
    users: int = Field(default=10, ge=1, description="concurrent locust users")
    spawn_rate: float = Field(default=100.0, gt=0, description="users started per second")
    duration_s: float = Field(
        default=20.0, gt=0, description="seconds of load from load_start (spawning included)"
    )
    wait_s: float = Field(
        default=0.05, ge=0, description="each user's pause after each of its requests, seconds"
    )
    request_timeout_s: float = Field(default=2.0, gt=0, description="a request not answered within it fails")
    window_ms: int = Field(
        default=100, ge=10, le=60_000, description="width of one load_window, milliseconds"
    )
    max_requests: int = Field(
        default=200_000, ge=1, description="the load stops after this many completed requests (a bound)"
    )


class LoadOptions(LoadShape):
    """The ``serve`` workload's locust load: the shape, and a mix of the replicas' own endpoints."""

    mix: dict[str, int] = Field(
        default_factory=lambda: {"predict": 9, "health": 1},
        description="request mix: endpoint (predict, health, info) -> integer weight (> 0)",
    )

    @field_validator("mix")
    @classmethod
    def _known_endpoints(cls, v: dict[str, int]) -> dict[str, int]:
        if not v:
            raise ValueError(f"the mix names no endpoint (known: {', '.join(ENDPOINTS)})")
        for name, weight in v.items():
            if name not in ENDPOINTS:
                raise ValueError(f"unknown endpoint '{name}' in the mix (known: {', '.join(ENDPOINTS)})")
            if weight <= 0:
                raise ValueError(f"endpoint '{name}': a weight must be > 0 (got {weight})")
        return v


class DeclaredRequest(BaseModel):
    """One request of a load declared in the suite (a user's own server's endpoints): sent as ``method path``
    with ``body`` as its JSON body; it succeeds when the answer's status is ``expect_status``."""

    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(
        default=None, min_length=1, description="its name in the load's counts (default: 'METHOD path')"
    )
    method: str = Field(default="GET", description=f"the HTTP method ({', '.join(HTTP_METHODS)})")
    path: str = Field(description="the path on the server, from '/' (query string allowed)")
    body: Any = Field(default=None, description="the request's JSON body, any JSON value (none: no body)")
    expect_status: int = Field(default=200, ge=100, le=599, description="the status of a successful answer")
    weight: int = Field(default=1, ge=1, description="its share of the requests, against the others' weights")

    @field_validator("method", mode="before")
    @classmethod
    def _method(cls, v: Any) -> Any:
        if isinstance(v, str):
            if v.upper() not in HTTP_METHODS:
                raise ValueError(f"unknown HTTP method '{v}' (known: {', '.join(HTTP_METHODS)})")
            return v.upper()
        return v

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith("/") or v.startswith("//") or any(c.isspace() for c in v):
            raise ValueError(
                f"'{v}' is not a path from '/' (the load only goes to the balancer: no scheme, host "
                "or spaces)"
            )
        return v

    @property
    def label(self) -> str:
        """Its name in the load's counts: ``name``, else ``METHOD path``."""
        return self.name or f"{self.method} {self.path}"


class RequestLoadOptions(LoadShape):
    """A locust load whose requests the suite declares (``serve-command``: a user's own server's endpoints)."""

    requests: list[DeclaredRequest] = Field(
        min_length=1,
        description="the requests the users send, each with its "
        "method, path, JSON body, expected status and weight",
    )

    @field_validator("requests")
    @classmethod
    def _unique(cls, v: list[DeclaredRequest]) -> list[DeclaredRequest]:
        seen: set[str] = set()
        for r in v:
            if r.label in seen:
                raise ValueError(f"two requests are named '{r.label}' (give one a name)")
            seen.add(r.label)
        return v


class SloOptions(BaseModel):
    """The availability SLO the run is judged against (read by the metrics from ``load_start``)."""

    model_config = ConfigDict(extra="forbid")
    availability: float = Field(
        default=0.999, gt=0, lt=1, description="availability objective (0.999: 99.9 %)"
    )
    window_days: float = Field(
        default=30.0, gt=0, description="the SLO's window, days (its error budget's period)"
    )
    error_rate: float = Field(
        default=0.01,
        ge=0,
        lt=1,
        description="a load window with at most this share of failed requests is healthy",
    )
    recovery_window_s: float = Field(
        default=5.0, gt=0, description="recovered: the first span this long whose windows are all healthy"
    )


class ServeOptions(BaseModel):
    """The ``serve`` workload's options (``workload: {name: serve, ranks: N, options: {...}}``)."""

    model_config = ConfigDict(extra="forbid")
    hidden: int = Field(default=64, ge=1, le=65_536, description="hidden width of the served MLP")
    layers: int = Field(default=2, ge=1, le=64, description="hidden layers of the served MLP")
    load_delay_s: float = Field(
        default=0.0,
        ge=0,
        description="extra sleep at the start of each model load, before the file is read "
        "(makes load time visible; a fault triggered by model_load_begin lands before the read)",
    )
    load: LoadOptions = Field(default_factory=LoadOptions, description="the locust load")
    slo: SloOptions = Field(default_factory=SloOptions, description="the availability SLO")


def load_program_argv(
    load: LoadShape, slo: SloOptions, target_url: str, allow_cidrs: Sequence[str] = ()
) -> list[str]:
    """The load program's command line (:mod:`chaosbench.workloads.serve_load`) for ``load`` (a
    :class:`LoadOptions` mix of the built-in endpoints, or a :class:`RequestLoadOptions`' declared requests)
    against ``target_url``; ``allow_cidrs``: networks besides loopback the target may be in."""
    argv = [
        sys.executable,
        "-m",
        LOAD_PROGRAM,
        "--target",
        target_url,
        "--users",
        str(load.users),
        "--spawn-rate",
        str(load.spawn_rate),
        "--duration-s",
        str(load.duration_s),
        "--wait-s",
        str(load.wait_s),
        "--request-timeout-s",
        str(load.request_timeout_s),
        "--window-ms",
        str(load.window_ms),
        "--max-requests",
        str(load.max_requests),
        "--slo-availability",
        str(slo.availability),
        "--slo-window-days",
        str(slo.window_days),
        "--slo-error-rate",
        str(slo.error_rate),
        "--slo-recovery-window-s",
        str(slo.recovery_window_s),
    ]
    if isinstance(load, LoadOptions):
        argv += ["--mix", ",".join(f"{name}={weight}" for name, weight in load.mix.items())]
    elif isinstance(load, RequestLoadOptions):
        argv += ["--requests", json.dumps([r.model_dump() for r in load.requests])]
    for cidr in allow_cidrs:
        argv += ["--allow-cidr", cidr]
    return argv


class Serve(ServingWorkload[ServeOptions]):
    """Replicas of a small torch MLP behind a load balancer, under locust load; see the module docstring."""

    name: ClassVar[str] = "serve"
    #: The replica calls the planted hooks around its model load (its "step 1"): see serve_replica.
    plants: ClassVar[bool] = True
    options: ServeOptions

    def model_file(self, run: RunPaths) -> Path:
        """The model checkpoint every replica loads: ``<ckpt_dir>/model.pt``."""
        return run.ckpt_dir / MODEL_FILE_NAME

    def _model_args(self, run: RunPaths) -> list[str]:
        o = self.options
        return [
            "--model-file",
            str(self.model_file(run)),
            "--hidden",
            str(o.hidden),
            "--layers",
            str(o.layers),
            "--seed",
            str(run.seed),
        ]

    def argv(self, run: RunPaths) -> list[str]:
        """One replica (environment: RANK, WORLD_SIZE, SERVE_HOST, SERVE_PORT and the probe's variables)."""
        return [
            sys.executable,
            "-m",
            REPLICA_PROGRAM,
            *self._model_args(run),
            "--load-delay-s",
            str(self.options.load_delay_s),
        ]

    def init_argv(self, run: RunPaths) -> list[str]:
        """The process that writes the model file (once, before the replicas start)."""
        return [sys.executable, "-m", REPLICA_PROGRAM, "--init-model", *self._model_args(run)]

    def load_argv(self, target_url: str, allow_cidrs: Sequence[str] = ()) -> list[str]:
        """The load process against ``target_url`` (``http://host:port``, normally the balancer's frontend).
        ``allow_cidrs``: networks besides loopback the target may be in (the docker runtime's internal network)."""
        return load_program_argv(self.options.load, self.options.slo, target_url, allow_cidrs)

    @property
    def total_steps(self) -> int | None:
        return None
