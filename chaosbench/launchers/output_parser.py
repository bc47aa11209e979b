"""How the command shim reads a user's script: its output, as written, turned into step, checkpoint and end events.

Standard-library only (it runs inside a rank's process, under the shim :mod:`chaosbench.launchers.command`).

The contract, for one process of the script (one rank of one incarnation):

- **Lines and redraws.** The output is cut at every ``\\n`` and every ``\\r``: a progress bar redraws its line
  with ``\\r`` (tqdm: ``"\\r 53%|█████▎    | 320/600 [00:32<00:28, 9.95it/s]"``, at most ~10 times a second), and
  each redraw is a line of its own. A redraw is read as soon as a write that carries it ends (its stamp is that
  write's), not when the next one begins: the last redraw before a kill is not lost. Each pattern matches a
  line at most once.
- **Steps.** ``step`` lines name a step: ``(?P<step>N)`` with the script's own counting, 0-based or 1-based
  (``step_base``; by default detected from the first step the run prints: 0 means 0-based, anything else
  1-based; a later incarnation counts as the run's first counted, read from the timeline's ``step_counting``
  event). A 0-based ``N`` is step ``N + 1`` of the timeline, whose steps are 1-based. A ``step`` pattern without a
  ``step`` group counts: with ``step_every: K`` each match is the next multiple of K after the previous match
  of this process, and not below the latest step another pattern reported (a loss line logged every K steps,
  beside a progress bar that lags); it starts from the position a ``ckpt_load_end`` line named. In a resumed
  process (a later incarnation) beside a progress bar, the bar says where training resumed: a counted line
  before the bar's first count and without such a line is no step (a resumed Hugging Face bar draws 0 and
  jumps to the restored step only at its next redraw, which can come after the first loss line). Within one
  process a step is reported once: a value not above the last one reported by the same pattern is skipped.
- **Progress bars.** ``progress`` lines carry a count of completed steps (``N/total``: the tqdm bar's ``n``,
  pattern alias ``tqdm``): 0 is no step, and a redraw of a count already shown (a bar redrawn in place, or a
  resumed bar that first draws 0) is no step either. A bar skips counts (it redraws at most every ~0.1 s):
  only the counts it shows are steps on the timeline. The alias ``tqdm`` matches the bar whose total is the
  run's steps, so another bar of the same script (``Writing model shards: 1/1``) is not read as training.
- **Per-step commit** (``per_step_commit``: the script trains through TorchFT's Manager, each replica group
  committing every step on its own; the torchft adapter says so). The ``step`` pattern names the Manager's
  committed step count (``manager.current_step()`` after ``optimizer.step()``, as TorchFT's examples print it),
  so its steps are reported ``committed``; named groups ``participants`` (replica groups in the quorum:
  ``manager.num_participants()``) and ``quorum_id`` go into the step too. ``step_skipped`` lines say a step
  was computed but not committed (TorchFT's Manager logs ``[<replica>/0 - step 10] should_commit=False ...``
  at INFO): ``(?P<step>N)`` is the steps committed by then, as the Manager counts them, so step ``N + 1`` was
  not committed (without the group: the step after the last one reported); ``(?P<reason>...)`` says why. The
  step line that follows it shows a count below ``N + 1`` and is no commit (a group that healed to step 11 and
  did not commit logs ``step 11`` too).
  Repeats of one skipped step (a line per rank, a traceback) are one. ``heal_begin`` / ``heal_end`` lines say a
  replica group that was behind fetches the live state from a peer and has applied it (TorchFT's Manager:
  ``healing required, fetching checkpoint metadata from ... max_step=29``, ``[...- step 29] Loaded state
  dict.``); ``(?P<step>N)``: the step it heals to; ``heal_end`` carries the seconds since this process's
  ``heal_begin``.
- **Checkpoints and the end.** ``ckpt_save_begin``/``_end``, ``ckpt_load_begin``/``_end`` may have ``step``
  (the number of steps done at that checkpoint, as the script names it: never shifted by ``step_base``);
  ``train_end`` may have ``digest``, ``loss`` and ``step`` (the number of steps done). A script without a
  closing line is judged by its exit (:mod:`chaosbench.analysis.metrics`).
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

#: tqdm's bar, e.g. `` 53%|█████▎    | 320/600 [00:32<00:28, 9.95it/s]`` (Hugging Face Trainer, accelerate):
#: the count of completed steps out of ``{total}``.
TQDM = r"\|\s*(?P<step>\d+)/{total}\s*\["
#: Names that stand for a pattern (``progress: tqdm``).
PATTERN_ALIASES = {"tqdm": TQDM}
#: The event kinds a pattern can produce, in the order they are tried on a line.
PATTERN_KINDS = (
    "progress",
    "step",
    "step_skipped",
    "heal_begin",
    "heal_end",
    "ckpt_save_begin",
    "ckpt_save_end",
    "ckpt_load_begin",
    "ckpt_load_end",
    "train_end",
)


def resolve_pattern(regex: str, total_steps: int | None = None) -> str:
    """A pattern's regex, with an alias replaced by what it stands for: ``tqdm`` is tqdm's bar whose total is the
    run's ``total_steps`` (the training bar, not another bar of the same script: ``Writing model shards: 1/1``),
    any total when it is not known."""
    if regex not in PATTERN_ALIASES:
        return regex
    return PATTERN_ALIASES[regex].replace("{total}", str(total_steps) if total_steps else r"\d+")


@dataclass(frozen=True)
class Parsed:
    """One event read from the output: its kind, its fields and its stamp (the write's)."""

    kind: str
    t_ns: int
    fields: dict[str, Any] = field(default_factory=dict)


def _num(v: str | None) -> float | None:
    try:
        return None if v is None else float(v)
    except ValueError:
        return None


class OutputParser:
    """Reads one process's output (:meth:`feed` each write as it comes, :meth:`end` once it ends) and returns the
    events it implies (module docstring). ``step_base``: 0 or 1 as declared, None to detect it (or to take
    ``earlier_base``, the run's counting as an earlier incarnation found it); ``step_every``: the cadence of a
    ``step`` pattern that has no ``step`` group; ``resumed``: the process is a later incarnation (where its
    counted lines start is then not known before a bar or a resume line says it)."""

    def __init__(
        self,
        patterns: dict[str, str],
        step_base: int | None = None,
        step_every: int | None = None,
        earlier_base: int | None = None,
        resumed: bool = False,
        per_step_commit: bool = False,
    ) -> None:
        self.patterns = [
            (k, re.compile(resolve_pattern(patterns[k]))) for k in PATTERN_KINDS if patterns.get(k)
        ]
        self.step_every = step_every
        self.per_step_commit = per_step_commit
        self._skipped = 0  # the last step a step_skipped line reported
        self._heal_ns: int | None = None  # when this process's last heal began
        # where a resumed process's counted lines start is the bar's to say (or a ckpt_load_end line's)
        self._position_unknown = resumed and any(k == "progress" for k, _ in self.patterns)
        self.base = step_base if step_base is not None else earlier_base
        if step_base is not None:
            self._base_how = "declared"
        elif earlier_base is not None:
            self._base_how = "as the run's first counted (an earlier incarnation)"
        else:
            self._base_how = ""
        self._base_told = False
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self._after_cr = False  # the pending text began right after a \r: a redraw
        self._matched: set[str] = (
            set()
        )  # pattern kinds the pending text matched already (a redraw read early)
        self._last: dict[str, int] = {}  # pattern kind -> the last step it reported
        self._counted = 0  # the last step a step pattern without a group counted
        self._position = 0  # where a ckpt_load_end line said the process resumed

    def feed(self, data: bytes, t_ns: int) -> list[Parsed]:
        """The events of one write of the process (``t_ns``: its stamp)."""
        out: list[Parsed] = []
        self._pending += self._decoder.decode(data)
        while True:
            cut = min((i for i in (self._pending.find("\r"), self._pending.find("\n")) if i >= 0), default=-1)
            if cut < 0:
                break
            out += self._line(self._pending[:cut], t_ns)
            self._after_cr = self._pending[cut] == "\r"
            self._matched = set()
            self._pending = self._pending[cut + 1 :]
        if (
            self._pending and self._after_cr
        ):  # a redraw so far: read it now (what it matches is not read again)
            out += self._line(self._pending, t_ns)
        return out

    def end(self, t_ns: int) -> list[Parsed]:
        """The events of a last line without a newline, once the output has ended."""
        self._pending += self._decoder.decode(b"", final=True)
        out = self._line(self._pending, t_ns) if self._pending else []
        self._pending, self._matched = "", set()
        return out

    # -- one line
    def _line(self, line: str, t_ns: int) -> list[Parsed]:
        out: list[Parsed] = []
        for kind, rx in self.patterns:
            m = None if kind in self._matched else rx.search(line)
            if m is None:
                continue
            self._matched.add(kind)
            g = m.groupdict()
            raw = int(g["step"]) if g.get("step") else None
            if kind == "progress":
                out += self._step(kind, raw, g, t_ns) if raw else []  # a count of 0 is no step
            elif kind == "step":
                if raw is None:  # a counted line: it stands for the step_every steps up to it
                    out += self._step(kind, self._counted_step(), g, t_ns, every=self.step_every)
                else:
                    out += self._step(kind, self._index(raw, out, t_ns), g, t_ns)
            elif kind == "step_skipped":
                step = raw + 1 if raw is not None else max(self._last.values(), default=0) + 1
                if step > self._skipped:
                    self._skipped = step
                    reason = (g.get("reason") or "").strip() or "not committed (the script's line)"
                    out.append(Parsed(kind, t_ns, {"step": step, "reason": reason[:300]}))
            elif kind in ("heal_begin", "heal_end"):
                heal: dict[str, Any] = {"step": raw}
                if kind == "heal_begin":
                    self._heal_ns = t_ns
                elif self._heal_ns is not None:
                    heal["duration_s"] = (t_ns - self._heal_ns) / 1e9
                    self._heal_ns = None
                out.append(Parsed(kind, t_ns, heal))
            elif kind == "train_end":
                out.append(
                    Parsed(
                        kind,
                        t_ns,
                        {"step": raw, "loss": _num(g.get("loss")), "digest": g.get("digest") or ""},
                    )
                )
            else:
                if kind == "ckpt_load_end" and raw is not None:
                    self._position, self._position_unknown = raw, False
                fields: dict[str, Any] = {"step": raw, "path": None}
                if kind == "ckpt_save_end":
                    fields["complete"] = True  # the script said it saved
                out.append(Parsed(kind, t_ns, fields))
        return out

    def _step(
        self, kind: str, step: int | None, g: dict[str, Any], t_ns: int, every: int | None = None
    ) -> list[Parsed]:
        if step is None or step <= self._last.get(kind, 0):
            return []  # a redraw, or a step this pattern reported already
        if self.per_step_commit and kind == "step" and step < self._skipped:
            return []  # the count after a step that did not commit (a group that healed to it logs it too)
        self._last[kind] = step
        fields: dict[str, Any] = {"step": step, "loss": _num(g.get("loss"))}
        if every:
            fields["every"] = every
        if self.per_step_commit:
            fields["committed"] = True
            for name in ("participants", "quorum_id"):
                if g.get(name) is not None and g[name].isdigit():
                    fields[name] = int(g[name])
        return [Parsed("step", t_ns, fields)]

    def _index(self, raw: int, out: list[Parsed], t_ns: int) -> int:
        """The 1-based step a ``step`` line's counter names (the counting decided on the first one)."""
        if self.base is None:
            self.base = 0 if raw == 0 else 1
            self._base_how = f"detected: the first step printed was {raw}"
        if not self._base_told:
            self._base_told = True
            out.append(Parsed("step_counting", t_ns, {"base": self.base, "how": self._base_how}))
        return raw + 1 - self.base

    def _counted_step(self) -> int | None:
        """The step a ``step`` line without a step number stands for (``step_every``)."""
        k = self.step_every
        if not k or (self._position_unknown and not self._last.get("progress")):
            return None  # no cadence, or a resumed process whose bar has not shown where it is yet
        floor = max(self._counted, self._position)  # above the previous count and the resumed position
        seen = max(self._last.values(), default=0)  # and not below what another pattern showed
        step = max(floor // k + 1, -(-seen // k)) * k
        self._counted = step
        return step


def earlier_step_base(events_path: str | None) -> int | None:
    """The counting an earlier process of the run decided (its ``step_counting`` event), or None."""
    if not events_path:
        return None
    try:
        with open(events_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if '"step_counting"' not in line:
                    continue
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if obj.get("kind") == "step_counting" and obj.get("base") in (0, 1):
                    return int(obj["base"])
    except OSError:
        return None
    return None


def parse_all(parser: OutputParser, writes: Iterable[tuple[bytes, int]]) -> list[Parsed]:
    """Every event of a whole output (each write with its stamp), as the shim would read it."""
    out: list[Parsed] = []
    t_ns = 0
    for data, t_ns in writes:
        out += parser.feed(data, t_ns)
    return out + parser.end(t_ns)
