"""Built-in workloads: ``ddp-mlp`` (a real DDP job with DCP checkpoints) and ``command`` (the user's own
training script, launched as is, its log lines turned into events by regexes)."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chaosbench.launchers.command import PLACEHOLDERS, placeholders
from chaosbench.workloads.base import RunPaths, Workload


class DdpMlpOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    steps: int = Field(default=60, ge=1, description="total optimizer steps")
    checkpoint_every: int = Field(default=10, ge=0, description="checkpoint after every K steps (0: never)")
    pg_timeout_s: float = Field(default=1800.0, gt=0, description="torch.distributed process-group timeout")
    hidden: int = Field(default=256, ge=1)
    layers: int = Field(default=3, ge=1)
    batch_size: int = Field(default=32, ge=1, description="per rank")
    lr: float = Field(default=0.01, gt=0)
    step_sleep_s: float = Field(default=0.0, ge=0, description="sleep added to each step (emulates slower steps)")
    load_fallback: bool = Field(
        default=False, description="a checkpoint that fails to load is skipped for the next older one"
    )
    bug: Literal["forget-rng", "forget-data-position", "non-atomic-ckpt"] | None = Field(
        default=None, description="plant a recovery bug (to prove that a gate catches it)"
    )


class DdpMlpWorkload(Workload):
    """A DDP MLP on gloo (NCCL when CUDA is present) over synthetic data; see :mod:`chaosbench.workloads.ddp_mlp`."""

    name: ClassVar[str] = "ddp-mlp"
    Options = DdpMlpOptions  # type: ignore[assignment]

    def argv(self, run: RunPaths) -> list[str]:
        o: Any = self.options
        return [
            sys.executable,
            "-m",
            "chaosbench.workloads.ddp_mlp",
            "--steps", str(o.steps),
            "--checkpoint-every", str(o.checkpoint_every),
            "--ckpt-dir", str(run.ckpt_dir),
            "--seed", str(run.seed),
            "--pg-timeout-s", str(o.pg_timeout_s),
            "--hidden", str(o.hidden),
            "--layers", str(o.layers),
            "--batch-size", str(o.batch_size),
            "--lr", str(o.lr),
            "--step-sleep-s", str(o.step_sleep_s),
            *(["--load-fallback"] if o.load_fallback else []),
            *(["--bug", o.bug] if o.bug else []),
        ]  # fmt: skip

    @property
    def pg_timeout_s(self) -> float | None:
        return float(self.options.pg_timeout_s)  # type: ignore[attr-defined]

    @property
    def total_steps(self) -> int | None:
        return int(self.options.steps)  # type: ignore[attr-defined]


class FsdpLmOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    steps: int = Field(default=60, ge=1, description="total optimizer steps")
    checkpoint_every: int = Field(default=10, ge=0, description="checkpoint after every K steps (0: never)")
    pg_timeout_s: float = Field(default=1800.0, gt=0, description="torch.distributed process-group timeout")
    vocab: int = Field(default=128, ge=2)
    seq_len: int = Field(default=32, ge=2)
    d_model: int = Field(default=64, ge=8)
    heads: int = Field(default=4, ge=1)
    layers: int = Field(default=2, ge=1)
    batch_size: int = Field(default=8, ge=1, description="sequences per rank")
    lr: float = Field(default=3e-3, gt=0)
    step_sleep_s: float = Field(default=0.0, ge=0, description="sleep added to each step (emulates slower steps)")


class FsdpLmWorkload(Workload):
    """A small transformer LM sharded with FSDP2 (every rank writes its own DCP shard); see
    :mod:`chaosbench.workloads.fsdp_lm`."""

    name: ClassVar[str] = "fsdp-lm"
    Options = FsdpLmOptions  # type: ignore[assignment]

    def argv(self, run: RunPaths) -> list[str]:
        o: Any = self.options
        return [
            sys.executable, "-m", "chaosbench.workloads.fsdp_lm",
            "--steps", str(o.steps), "--checkpoint-every", str(o.checkpoint_every),
            "--ckpt-dir", str(run.ckpt_dir), "--seed", str(run.seed),
            "--pg-timeout-s", str(o.pg_timeout_s), "--vocab", str(o.vocab), "--seq-len", str(o.seq_len),
            "--d-model", str(o.d_model), "--heads", str(o.heads), "--layers", str(o.layers),
            "--batch-size", str(o.batch_size), "--lr", str(o.lr), "--step-sleep-s", str(o.step_sleep_s),
        ]  # fmt: skip

    @property
    def pg_timeout_s(self) -> float | None:
        return float(self.options.pg_timeout_s)  # type: ignore[attr-defined]

    @property
    def total_steps(self) -> int | None:
        return int(self.options.steps)  # type: ignore[attr-defined]


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
