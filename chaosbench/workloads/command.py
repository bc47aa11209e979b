"""The ``command`` workload: the user's own training script, launched as is under the shim
(:mod:`chaosbench.launchers.command`), its log lines turned into events by regexes."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chaosbench.launchers.command import PLACEHOLDERS, placeholders
from chaosbench.workloads.base import RunPaths, Workload


class LogPatterns(BaseModel):
    """Regexes over the script's output lines. ``step`` needs a named group ``step`` (optionally ``loss``);
    checkpoint patterns may have ``step``; ``train_end`` may have ``digest``, ``loss`` and ``step``."""

    model_config = ConfigDict(extra="forbid")
    step: str | None = None
    ckpt_save_begin: str | None = None
    ckpt_save_end: str | None = None
    ckpt_load_begin: str | None = None
    ckpt_load_end: str | None = None
    train_end: str | None = None

    @model_validator(mode="after")
    def _compile(self) -> LogPatterns:
        for name, rx in self.model_dump().items():
            if rx is None:
                continue
            try:
                compiled = re.compile(rx)
            except re.error as exc:
                raise ValueError(f"pattern '{name}' is not a valid regex: {exc}") from None
            if name == "step" and "step" not in compiled.groupindex:
                raise ValueError("pattern 'step' needs a named group (?P<step>\\d+)")
        return self


class CommandOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: list[str] = Field(
        description="the training command of one rank; placeholders such as {ckpt_dir}, {project_dir} and {rank} "
        "are substituted (see PLACEHOLDERS)"
    )
    patterns: LogPatterns = Field(default_factory=LogPatterns)
    cwd: str | None = Field(
        default=None,
        description="working directory of the script (placeholders allowed); default: a fresh directory of the "
        "run ({work_dir}), shared by its ranks and incarnations, so nothing the script writes there reaches "
        "another run",
    )
    env: dict[str, str] = Field(default_factory=dict, description="environment of the script (placeholders allowed)")
    steps: int | None = Field(default=None, ge=1, description="total steps, when known")
    pg_timeout_s: float | None = Field(
        default=None, gt=0, description="the script's process-group timeout, when it sets one (else torch's default)"
    )

    @field_validator("command", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = shlex.split(v)
        if isinstance(v, list) and not v:
            raise ValueError("command is empty")
        return v

    @model_validator(mode="after")
    def _placeholders(self) -> CommandOptions:
        strings = [("command", s) for s in self.command] + [(f"env.{k}", v) for k, v in self.env.items()]
        strings += [("cwd", self.cwd)] if self.cwd is not None else []
        for where, text in strings:
            try:
                names = placeholders(text)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
            unknown = [n for n in names if n not in PLACEHOLDERS]
            if unknown:
                raise ValueError(
                    f"{where}: unknown placeholder {{{unknown[0]}}} (known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)})"
                )
        if self.cwd is None:
            for arg in self.command:
                if "{" in arg or os.path.isabs(arg) or arg.startswith("-") or not os.path.isfile(arg):
                    continue
                raise ValueError(
                    f"command: '{arg}' is a path relative to this directory, but the script starts in a fresh working "
                    f"directory of its run; write {{project_dir}}/{arg} (or an absolute path), or set cwd"
                )
        return self


class CommandWorkload(Workload):
    """The user's own script, run unchanged under :mod:`chaosbench.launchers.command`, which substitutes the
    placeholders, starts the script in its working directory, reports its pid and turns its log lines into step /
    checkpoint events.

    Isolation: every run has its own empty checkpoint directory (``{ckpt_dir}``) and, unless ``cwd`` is given, its
    own working directory (``{work_dir}`` = ``<run_dir>/work``), so a checkpoint one run leaves behind can never be
    picked up by another. The user's files are reachable by absolute path or through ``{project_dir}`` (the
    directory chaosbench was started in) and ``{suite_dir}`` (the suite file's directory)."""

    name: ClassVar[str] = "command"
    Options = CommandOptions  # type: ignore[assignment]

    def substitutions(self, run: RunPaths) -> dict[str, str]:
        """The run's placeholder values (the per-rank ones are filled in by the shim)."""
        return {
            "ckpt_dir": str(run.ckpt_dir),
            "run_dir": str(run.run_dir),
            "work_dir": str(run.run_dir / "work"),
            "seed": str(run.seed),
            "project_dir": run.project_dir,
            "suite_dir": run.suite_dir,
        }

    def argv(self, run: RunPaths) -> list[str]:
        o: Any = self.options
        return [
            sys.executable,
            "-m",
            "chaosbench.launchers.command",
            "--patterns",
            o.patterns.model_dump_json(exclude_none=True),
            "--subst",
            json.dumps(self.substitutions(run), sort_keys=True),
            *(["--env", json.dumps(o.env, sort_keys=True)] if o.env else []),
            "--cwd",
            o.cwd if o.cwd is not None else "{work_dir}",
            "--",
            *o.command,
        ]

    def env(self, run: RunPaths) -> dict[str, str]:
        return {"CHAOSBENCH_CKPT_DIR": str(run.ckpt_dir)}

    @property
    def pg_timeout_s(self) -> float | None:
        return self.options.pg_timeout_s  # type: ignore[attr-defined, no-any-return]

    @property
    def total_steps(self) -> int | None:
        return self.options.steps  # type: ignore[attr-defined, no-any-return]
