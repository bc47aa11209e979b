"""The ``serve-command`` workload: the user's own model server as the replicas behind the balancer, started from
its command line, judged ready by its own health path, driven by the requests the suite declares.

A separate workload, not an option of ``serve``, for the reason ``command`` is one beside the built-in trainers:
nothing of ``serve`` applies to a server chaosbench did not write (its MLP's sizes, the model file an ``init``
process writes, the planted faults' hooks at its model load, the ``replica_ready`` it says itself, the mix of
its own endpoints), while the balancer and the measurement are the same: the ``balancer`` adapter runs any
:class:`~chaosbench.workloads.base.ServingWorkload`.

Each replica runs under the command shim (:mod:`chaosbench.launchers.command` with ``--ready``), which
substitutes ``{port}`` (the port the balancer sends the replica's traffic to: ``SERVE_PORT``), ``{host}`` (the
address to bind: ``SERVE_HOST``) and the ``command`` workload's placeholders (``{rank}``, ``{project_dir}``, ...),
starts the command in the run's working directory, says ``rank_start`` with the server's pid (what a kill
targets), polls ``GET ready.path`` until it answers ``ready.expect_status`` and then says ``replica_ready``.
The balancer's health checks GET the same path and expect the same status. The load (:mod:`chaosbench.workloads.
serve_load`) sends ``load.requests``: method, path, JSON body, weight; a request succeeds when its answer has its
``expect_status``. Events, metrics and the recovery policies are those of ``serve``
(:mod:`chaosbench.analysis.serving`).

``ranks`` is the number of replicas; there are no training steps (the run is complete when the load exits 0).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from chaosbench.launchers.command import PLACEHOLDERS, SERVE_PLACEHOLDERS, placeholders
from chaosbench.workloads.base import RunPaths, ServingWorkload
from chaosbench.workloads.command import check_placeholders, check_script_paths, run_values, split_command
from chaosbench.workloads.serve import RequestLoadOptions, SloOptions, load_program_argv

#: The placeholders a server's command, env and cwd may use.
SERVER_PLACEHOLDERS = PLACEHOLDERS + SERVE_PLACEHOLDERS
#: The command shim, as ``python -m`` runs it.
SHIM = "chaosbench.launchers.command"


class ReadyCheck(BaseModel):
    """When a replica is ready: ``GET path`` answers ``expect_status`` (polled by its shim; the balancer's health
    checks use the same path and status)."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(default="/health", description="the health path, from '/'")
    expect_status: int = Field(default=200, ge=100, le=599, description="the status of a healthy answer")
    interval_s: float = Field(
        default=0.1, gt=0, le=60, description="pause between two polls until ready, seconds"
    )
    timeout_s: float = Field(default=1.0, gt=0, le=60, description="one poll's timeout, seconds")

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith("/") or v.startswith("//") or any(c.isspace() for c in v):
            raise ValueError(f"'{v}' is not a path from '/' (no scheme, host or spaces)")
        return v


class ServeCommandOptions(BaseModel):
    """The ``serve-command`` workload's options (``workload: {name: serve-command, ranks: N, command: [...], ...}``).
    ``cwd`` and ``env`` come before ``command`` so that the check for ``{port}`` sees them and names the command's
    line."""

    model_config = ConfigDict(extra="forbid")
    cwd: str | None = Field(
        default=None,
        description="working directory of the server (placeholders allowed); default: a fresh "
        "directory of the run ({work_dir}), shared by its replicas and their restarts",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="environment of the server (placeholders allowed)"
    )
    command: list[str] = Field(
        description="one replica's command line; {port} (the port it must listen on) is required here or in env, "
        "{host} is the address to bind, and the command workload's placeholders ({rank}, {project_dir}, ...) are "
        "substituted"
    )
    ready: ReadyCheck = Field(default_factory=ReadyCheck, description="when a replica is ready (and healthy)")
    load: RequestLoadOptions = Field(description="the locust load: its shape and the requests it sends")
    slo: SloOptions = Field(default_factory=SloOptions, description="the availability SLO")

    @field_validator("cwd")
    @classmethod
    def _cwd(cls, v: str | None) -> str | None:
        if v is not None:
            check_placeholders([("", v)], SERVER_PLACEHOLDERS)
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        check_placeholders([(k, text) for k, text in v.items()], SERVER_PLACEHOLDERS)
        return v

    @field_validator("command", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        return split_command(v)

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str], info: ValidationInfo) -> list[str]:
        check_placeholders([("", s) for s in v], SERVER_PLACEHOLDERS)
        env = info.data.get("env") or {}
        if not any("port" in placeholders(text) for text in [*v, *env.values()]):
            raise ValueError(
                "no {port}: each replica must listen on the port the balancer gives it (put {port} in "
                "the command or in an env value)"
            )
        if info.data.get("cwd") is None and "cwd" in info.data:
            check_script_paths(v, at="")
        return v


class ServeCommand(ServingWorkload[ServeCommandOptions]):
    """The user's own model server as the balancer's replicas; see the module docstring."""

    name: ClassVar[str] = "serve-command"
    users_script: ClassVar[bool] = True

    def argv(self, run: RunPaths) -> list[str]:
        """One replica: the shim, with the run's placeholder values and the readiness check, then the command."""
        o = self.options
        return [
            sys.executable,
            "-m",
            SHIM,
            "--patterns",
            "{}",
            "--subst",
            json.dumps(run_values(run), sort_keys=True),
            *(["--env", json.dumps(o.env, sort_keys=True)] if o.env else []),
            "--cwd",
            o.cwd if o.cwd is not None else "{work_dir}",
            "--ready",
            json.dumps(o.ready.model_dump(), sort_keys=True),
            "--",
            *o.command,
        ]

    @property
    def health_path(self) -> str:
        return self.options.ready.path

    @property
    def health_status(self) -> int | None:
        return self.options.ready.expect_status

    def load_argv(self, target_url: str, allow_cidrs: Sequence[str] = ()) -> list[str]:
        return load_program_argv(self.options.load, self.options.slo, target_url, allow_cidrs)

    @property
    def total_steps(self) -> int | None:
        return None
