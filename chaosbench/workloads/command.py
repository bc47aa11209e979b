"""The ``command`` workload: the user's own training script, launched as is under the shim
(:mod:`chaosbench.launchers.command`), its log lines turned into events by regexes."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chaosbench.launchers.command import PLACEHOLDERS, RANK_PLACEHOLDERS, placeholders, substitute
from chaosbench.launchers.output_parser import resolve_pattern
from chaosbench.workloads.base import RunPaths, Workload


class LogPatterns(BaseModel):
    """Regexes over the script's output lines and progress-bar redraws (how they are read:
    :mod:`chaosbench.launchers.output_parser`). ``step`` needs a named group ``step`` (optionally ``loss``),
    unless the workload declares ``step_every``; ``progress`` is a progress bar's count of completed steps
    (``tqdm`` stands for tqdm's bar); checkpoint patterns may have ``step``; ``train_end`` may have ``digest``,
    ``loss`` and ``step``. Under the ``torchft`` adapter ``step`` names the Manager's committed step count and
    may have ``participants`` and ``quorum_id``, ``step_skipped`` is a step not committed (``step``: the
    steps committed by then, as TorchFT's Manager logs it; ``reason``), and ``heal_begin``/``heal_end`` a group
    healing from a peer (``step``: the step it heals to)."""

    model_config = ConfigDict(extra="forbid")
    step: str | None = None
    progress: str | None = Field(
        default=None,
        description="a progress bar's completed-step count, (?P<step>...); 'tqdm' for tqdm's bar",
    )
    step_skipped: str | None = Field(
        default=None,
        description="per-step commit (torchft adapter): a line saying a step was computed but not committed, "
        "(?P<step>N) the steps committed by then (TorchFT's Manager: '- step 10] should_commit=False': step 11), "
        "(?P<reason>...) why",
    )
    heal_begin: str | None = Field(
        default=None,
        description="per-step commit (torchft adapter): a replica group starts fetching the live state from a peer "
        "(TorchFT's Manager: 'healing required, ... max_step=(?P<step>N)'), (?P<step>N) the step it heals to",
    )
    heal_end: str | None = Field(
        default=None,
        description="per-step commit (torchft adapter): the fetched state is applied (TorchFT's Manager: "
        "'- step (?P<step>N)] Loaded state dict.')",
    )
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
                compiled = re.compile(resolve_pattern(rx))
            except re.error as exc:
                raise ValueError(f"pattern '{name}' is not a valid regex: {exc}") from None
            if name == "progress" and "step" not in compiled.groupindex:
                raise ValueError("pattern 'progress' needs a named group (?P<step>\\d+) (or is 'tqdm')")
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
    env: dict[str, str] = Field(
        default_factory=dict, description="environment of the script (placeholders allowed)"
    )
    steps: int | None = Field(default=None, ge=1, description="total steps, when known")
    pg_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="the script's process-group timeout, when it sets one (else torch's default)",
    )
    step_base: Literal[0, 1] | None = Field(
        default=None,
        description="how the step pattern's numbers count: 0 (the first step is 0: a line inside or at the start of "
        "each step, like Lightning's global_step or an epoch header) or 1; default: detected from the first step "
        "the run prints (0 means 0-based)",
    )
    step_every: int | None = Field(
        default=None,
        ge=1,
        description="a step pattern without a (?P<step>...) group: its lines come every this many steps (e.g. a "
        "loss line every logging_steps), and are numbered by counting",
    )
    watch_checkpoints: bool | None = Field(
        default=None,
        description="take checkpoint saves from the filesystem (new checkpoint files and directories under the "
        "checkpoint and working directories, stamped by the watcher): default when no ckpt_save_end pattern is "
        "given",
    )
    fidelity_from: str | None = Field(
        default=None,
        description="the final artifact whose tensors are the run's final state, a file, a directory or a glob "
        "(placeholders allowed, e.g. '{ckpt_dir}/final'): digested when the run ends, for fidelity against the "
        "control",
    )

    @field_validator("command", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        return split_command(v)

    @model_validator(mode="after")
    def _counting(self) -> CommandOptions:
        step = self.patterns.step
        if step is not None and "step" not in re.compile(step).groupindex and self.step_every is None:
            raise ValueError(
                "pattern 'step' needs a named group (?P<step>\\d+), or step_every: N (its lines come "
                "every N steps)"
            )
        return self

    @model_validator(mode="after")
    def _placeholders(self) -> CommandOptions:
        strings = [("command", s) for s in self.command] + [(f"env.{k}", v) for k, v in self.env.items()]
        strings += [("cwd", self.cwd)] if self.cwd is not None else []
        strings += [("fidelity_from", self.fidelity_from)] if self.fidelity_from is not None else []
        check_placeholders(strings, PLACEHOLDERS)
        if self.fidelity_from is not None and (
            per_rank := set(placeholders(self.fidelity_from)) & set(RANK_PLACEHOLDERS)
        ):
            raise ValueError(
                f"fidelity_from: {{{sorted(per_rank)[0]}}} differs per rank; the final artifact is the "
                "run's (use {ckpt_dir}, {work_dir}, {run_dir})"
            )
        if self.cwd is None:
            check_script_paths(self.command)
        return self


def split_command(v: Any) -> Any:
    """A ``command`` option as given: a string split as a shell would, an empty one refused (pydantic then
    checks the type)."""
    if isinstance(v, str):
        v = shlex.split(v)
    if isinstance(v, list) and not v:
        raise ValueError("command is empty")
    return v


def check_placeholders(strings: list[tuple[str, str]], known: tuple[str, ...]) -> None:
    """Each (where, template) uses only ``known`` placeholders; ValueError naming the first that does not (and
    ``where``, unless it is empty)."""
    for where, text in strings:
        at = f"{where}: " if where else ""
        try:
            names = placeholders(text)
        except ValueError as exc:
            raise ValueError(f"{at}{exc}") from None
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(
                f"{at}unknown placeholder {{{unknown[0]}}} (known: {', '.join('{' + p + '}' for p in known)})"
            )


def check_script_paths(command: list[str], at: str = "command: ") -> None:
    """ValueError (its text after ``at``) for an argument that is a file relative to this directory: the script
    starts elsewhere (in a fresh working directory of its run)."""
    for arg in command:
        if "{" in arg or os.path.isabs(arg) or arg.startswith("-") or not os.path.isfile(arg):
            continue
        raise ValueError(
            f"{at}'{arg}' is a path relative to this directory, but the script starts in a fresh working "
            f"directory of its run; write {{project_dir}}/{arg} (or an absolute path), or set cwd"
        )


def run_values(run: RunPaths) -> dict[str, str]:
    """The run's placeholder values (:data:`RUN_PLACEHOLDERS`; the per-rank ones are filled in by the shim)."""
    return {
        "ckpt_dir": str(run.ckpt_dir),
        "run_dir": str(run.run_dir),
        "work_dir": str(run.run_dir / "work"),
        "seed": str(run.seed),
        "project_dir": run.project_dir,
        "suite_dir": run.suite_dir,
    }


class CommandWorkload(Workload[CommandOptions]):
    """The user's own script, run unchanged under :mod:`chaosbench.launchers.command`, which substitutes the
    placeholders, starts the script in its working directory, reports its pid and turns its log lines into step /
    checkpoint events.

    Isolation: every run has its own empty checkpoint directory (``{ckpt_dir}``) and, unless ``cwd`` is given, its
    own working directory (``{work_dir}`` = ``<run_dir>/work``), so a checkpoint one run leaves behind can never be
    picked up by another. The user's files are reachable by absolute path or through ``{project_dir}`` (the
    directory chaosbench was started in) and ``{suite_dir}`` (the suite file's directory)."""

    name: ClassVar[str] = "command"
    users_script: ClassVar[bool] = True

    def substitutions(self, run: RunPaths) -> dict[str, str]:
        """The run's placeholder values (the per-rank ones are filled in by the shim)."""
        return run_values(run)

    def argv(self, run: RunPaths) -> list[str]:
        o = self.options
        return [
            sys.executable,
            "-m",
            "chaosbench.launchers.command",
            "--patterns",
            json.dumps(
                {k: resolve_pattern(v, o.steps) for k, v in o.patterns.model_dump(exclude_none=True).items()}
            ),
            "--subst",
            json.dumps(self.substitutions(run), sort_keys=True),
            *(["--env", json.dumps(o.env, sort_keys=True)] if o.env else []),
            "--cwd",
            o.cwd if o.cwd is not None else "{work_dir}",
            "--step-base",
            "auto" if o.step_base is None else str(o.step_base),
            *(["--step-every", str(o.step_every)] if o.step_every else []),
            "--",
            *o.command,
        ]

    def env(self, run: RunPaths) -> dict[str, str]:
        return {"CHAOSBENCH_CKPT_DIR": str(run.ckpt_dir)}

    def work_dir(self, run: RunPaths) -> Path:
        """The script's working directory."""
        o = self.options
        if o.cwd is None:
            return run.run_dir / "work"
        rank0 = {
            "rank": "0",
            "local_rank": "0",
            "world_size": str(self.spec.ranks),
            "node": "node0",
            "incarnation": "0",
        }
        return Path(
            substitute(o.cwd, {**self.substitutions(run), **rank0})
        )  # rank 0's, when it differs per rank

    def watched_dirs(self, run: RunPaths) -> list[Path]:
        """Where the script's checkpoint saves are taken from the filesystem (``watch_checkpoints``): its checkpoint
        and working directories; none when its own log lines report the saves."""
        o = self.options
        watch = o.watch_checkpoints if o.watch_checkpoints is not None else o.patterns.ckpt_save_end is None
        return [run.ckpt_dir, self.work_dir(run)] if watch else []

    def final_artifact(self, run: RunPaths) -> str | None:
        """``fidelity_from`` with the run's placeholders substituted (a path or a glob), or None."""
        o = self.options
        return None if o.fidelity_from is None else substitute(o.fidelity_from, self.substitutions(run))

    @property
    def pg_timeout_s(self) -> float | None:
        return self.options.pg_timeout_s

    @property
    def total_steps(self) -> int | None:
        return self.options.steps
