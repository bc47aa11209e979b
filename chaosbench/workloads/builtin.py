"""Built-in workloads: ``ddp-mlp`` (a real DDP job with DCP checkpoints) and ``command`` (the user's own
training script, launched as is, its log lines turned into events by regexes)."""

from __future__ import annotations

import re
import shlex
import sys
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chaosbench.workloads.base import Workload

if TYPE_CHECKING:
    from chaosbench.frameworks.base import JobContext


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

    def argv(self, job: JobContext) -> list[str]:
        o: Any = self.options
        return [
            sys.executable,
            "-m",
            "chaosbench.workloads.ddp_mlp",
            "--steps", str(o.steps),
            "--checkpoint-every", str(o.checkpoint_every),
            "--ckpt-dir", str(job.ckpt_dir),
            "--seed", str(job.scenario.seed),
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

    def argv(self, job: JobContext) -> list[str]:
        o: Any = self.options
        return [
            sys.executable, "-m", "chaosbench.workloads.fsdp_lm",
            "--steps", str(o.steps), "--checkpoint-every", str(o.checkpoint_every),
            "--ckpt-dir", str(job.ckpt_dir), "--seed", str(job.scenario.seed),
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
        description="the training command of one rank; {ckpt_dir}, {run_dir} and {seed} are substituted"
    )
    patterns: LogPatterns = Field(default_factory=LogPatterns)
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    steps: int | None = Field(default=None, ge=1, description="total steps, when known")
    pg_timeout_s: float | None = Field(default=None, gt=0, description="the script's process-group timeout")

    @field_validator("command", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = shlex.split(v)
        if isinstance(v, list) and not v:
            raise ValueError("command is empty")
        return v


class CommandWorkload(Workload):
    """The user's own script, run unchanged under :mod:`chaosbench.workloads.command_shim`, which reports
    the script's pid and turns its log lines into step / checkpoint events."""

    name: ClassVar[str] = "command"
    Options = CommandOptions  # type: ignore[assignment]

    def argv(self, job: JobContext) -> list[str]:
        o: Any = self.options
        subst = {"ckpt_dir": str(job.ckpt_dir), "run_dir": str(job.run_dir), "seed": str(job.scenario.seed)}
        cmd = [part.format(**subst) for part in o.command]
        return [
            sys.executable,
            "-m",
            "chaosbench.workloads.command_shim",
            "--patterns",
            o.patterns.model_dump_json(exclude_none=True),
            "--",
            *cmd,
        ]

    def env(self, job: JobContext) -> dict[str, str]:
        env = {"CHAOSBENCH_CKPT_DIR": str(job.ckpt_dir)}
        env.update(self.options.env)  # type: ignore[attr-defined]
        return env

    @property
    def pg_timeout_s(self) -> float | None:
        return self.options.pg_timeout_s  # type: ignore[attr-defined, no-any-return]

    @property
    def total_steps(self) -> int | None:
        return self.options.steps  # type: ignore[attr-defined, no-any-return]
