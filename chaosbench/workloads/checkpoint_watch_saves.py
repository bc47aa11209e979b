"""The checkpoint saves in progress (:class:`SaveTracker`): what the watcher's filesystem events (writes,
closes, renames, removals) do to them, and how each ends (judged when it is quiet, closed or renamed into
place; incomplete when it is gone first). The rules are those of :mod:`chaosbench.workloads.checkpoint_watch`
("What is one save")."""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass

from chaosbench.injectors.corrupt_checkpoint.formats import step_of
from chaosbench.workloads.checkpoint_watch_judge import (
    PendingSave,
    WholeCheck,
    created_changed,
    file_stat,
    judge_dir,
    judge_file,
    quiet_due,
)
from chaosbench.workloads.checkpoint_watch_paths import CheckpointLayout, Place, is_checkpoint_dir_name
from chaosbench.workloads.checkpoint_watch_timeline import WatchRecorder

#: First-write stamps kept for files and temporary directories that may be renamed into a checkpoint's name.
STAGED_MAX = 4096


@dataclass
class StagedWrite:
    """The first write seen of a file or temporary directory that is no checkpoint (yet): a rename into a
    checkpoint's name makes it a save that began then. ``closed``: the file was closed since."""

    first_ns: int
    closed: bool = False


class FirstWrites:
    """The first-write stamps (wall-clock ns) of what is no save yet but may become one by a rename: files of
    other names (``other``), temporary directories and files in them (``staging``), and the creation of every
    directory (a checkpoint directory's save begins then). The newest 4096 of each are kept."""

    def __init__(self) -> None:
        self._staged: OrderedDict[str, StagedWrite] = OrderedDict()
        self._dir_born: OrderedDict[str, int] = OrderedDict()

    def stage(self, key: str, t: int, what: str, reset: bool) -> None:
        """A ``create``/``modify``/``close`` of ``key`` (or of a file in the temporary directory ``key``) at
        ``t``: the first write is kept until a close; ``reset``: a write after a close starts afresh."""
        rec = self._staged.get(key)
        if what == "close":
            if rec is not None:
                rec.closed = True
            return
        if rec is None or (reset and rec.closed):
            self._staged[key] = StagedWrite(t)
            self._staged.move_to_end(key)
            while len(self._staged) > STAGED_MAX:
                self._staged.popitem(last=False)

    def get(self, key: str) -> StagedWrite | None:
        """The stamp kept for ``key``, kept on."""
        return self._staged.get(key)

    def take(self, key: str) -> StagedWrite | None:
        """The stamp kept for ``key``, forgotten."""
        return self._staged.pop(key, None)

    def keep_renamed(self, key: str, first_ns: int, closed: bool) -> None:
        """Something renamed to ``key`` that is no save: its first write, unless one is kept already."""
        if key not in self._staged:
            self._staged[key] = StagedWrite(first_ns, closed=closed)

    def dir_created(self, path: str, t: int) -> None:
        """The directory ``path`` was created at ``t``."""
        self._dir_born[path] = t
        while len(self._dir_born) > STAGED_MAX:
            self._dir_born.popitem(last=False)

    def dir_born(self, path: str, default: int) -> int:
        """When the directory ``path`` was created; ``default`` when not seen."""
        return self._dir_born.get(path, default)

    def forget(self, path: str, is_dir: bool) -> None:
        """``path`` was removed (a directory: with everything in it)."""
        prefix = path + os.sep
        self._staged.pop(path, None)
        self._dir_born.pop(path, None)
        if is_dir:
            for table in (self._staged, self._dir_born):
                for key in [k for k in table if k.startswith(prefix)]:
                    del table[key]


class SaveTracker:
    """The pending saves under the watched directories and the stamps that may begin one, moved on by the
    watcher's filesystem events (stamps: ``t`` wall-clock ns when the event reached the watcher, ``mono`` the
    monotonic seconds then; ``syn``: watchdog's synthetic event for the content of a directory moved in).
    Writes each save's begin and end through ``recorder``; ``whole`` judges one file's format. Not
    thread-safe: every method is called holding the watcher's lock."""

    def __init__(
        self,
        layout: CheckpointLayout,
        recorder: WatchRecorder,
        whole: WholeCheck,
        quiet_s: float,
        empty_hold_s: float,
    ) -> None:
        self._layout = layout
        self._recorder = recorder
        self._whole = whole
        self._quiet_s = quiet_s
        self._empty_hold_s = empty_hold_s
        self._saves: dict[str, PendingSave] = {}
        self._saved_step: dict[str, int | None] = {}  # checkpoint -> the step its last save was written with
        self._firsts = FirstWrites()

    def place(self, path: str, is_dir: bool) -> Place | None:
        """Where ``path`` belongs, given the directory saves pending now (see :meth:`CheckpointLayout.place`)."""
        return self._layout.place(path, is_dir, self._pending_dir)

    def _pending_dir(self, path: str) -> bool:
        pending = self._saves.get(path)
        return pending is not None and pending.is_dir

    def pending(self, key: str) -> bool:
        """Whether a save of the checkpoint ``key`` is in progress."""
        return key in self._saves

    def saved_step(self, key: str) -> int | None:
        """The step the last save of the checkpoint ``key`` was written with; None: none seen."""
        return self._saved_step.get(key)

    # ------------------------------------------------------------------ ending saves

    def finish_due(self, mono: float) -> float | None:
        """Judge every save quiet long enough by ``mono`` (a failure to judge one drops it, reported); returns
        when the next may be due (monotonic seconds), None: not before another event."""
        next_due: float | None = None
        for save in list(self._saves.values()):
            try:
                due = quiet_due(save, self._quiet_s, self._empty_hold_s)
                if due is not None and due <= mono and not created_changed(save, mono):
                    self._finish(save)
                    continue
                due = quiet_due(save, self._quiet_s, self._empty_hold_s)
            except Exception as exc:  # noqa: BLE001 - drop the save rather than fail on it forever
                self._saves.pop(save.key, None)
                self._recorder.report(f"judging {save.key!r}", exc)
                continue
            if due is not None:
                next_due = due if next_due is None else min(next_due, due)
        return next_due

    def finish_all(self) -> None:
        """Judge every pending save now, oldest first (the watcher is stopping)."""
        for save in sorted(self._saves.values(), key=lambda s: s.first_ns):
            try:
                self._finish(save)
            except Exception as exc:  # noqa: BLE001 - one save's trouble must not lose the others
                self._recorder.report(f"judging {save.key!r} at stop", exc)
        self._saves.clear()

    # ------------------------------------------------------------------ events

    def _activity(self, save: PendingSave, t: int, mono: float, sample: bool) -> None:
        """Something happened to ``save`` at ``t``/``mono``; ``sample``: take the timeline's step now (a save
        whose name has no step ends with the step of its last close or rename)."""
        save.last_ns = max(save.last_ns, t)
        save.last_mono = mono
        if sample and save.name_step is None:
            save.timeline_step, save.sampled = self._recorder.step(), True

    def _unit(self, p: Place, t: int, mono: float) -> PendingSave:
        """The pending save of the checkpoint directory ``p.key``, begun now (or at the directory's creation)
        when there is none."""
        save = self._saves.get(p.key)
        if save is None or not save.is_dir:
            save = PendingSave(
                root=p.root,
                key=p.key,
                is_dir=True,
                first_ns=min(t, self._firsts.dir_born(p.key, t)),
                last_ns=t,
                last_mono=mono,
                name_step=self._layout.name_step(p.root, p.key),
                confirmed=False,
                dcp_only=p.key == p.root or not is_checkpoint_dir_name(os.path.basename(p.key)),
            )
            self._saves[p.key] = save
        return save

    def _confirm(self, save: PendingSave) -> None:
        """A directory save holds a checkpoint file: it is a save; write its begin (once)."""
        if not save.confirmed:
            save.confirmed = True
            self._recorder.save_begin(save)

    def _track(self, save: PendingSave, path: str, what: str, t: int, mono: float, syn: bool) -> None:
        """A ``create``/``modify``/``close`` of ``path``, part of ``save``: which of its files are created and
        not written, written and not closed."""
        if what == "create":
            if syn:  # content of a directory moved in: arrived with the move, already stamped
                save.last_mono = mono
                return
            st = file_stat(path)
            if st is not None:  # a link (or a file gone already) is written by no one
                save.created[path] = (mono, st)
            self._activity(save, t, mono, sample=True)
        elif what == "modify":
            save.created.pop(path, None)
            save.written.add(path)
            self._activity(save, t, mono, sample=False)
        else:
            save.created.pop(path, None)
            save.written.discard(path)
            self._activity(save, t, mono, sample=True)

    def _atomic(self, p: Place, path: str, begin_ns: int, t: int, mono: float) -> None:
        """A checkpoint file ``path`` appeared whole at ``t`` (a rename, or a directory moved in): one save,
        begun at ``begin_ns`` (its first write seen), judged now; a pending save of that name ends incomplete."""
        stale = self._saves.pop(path, None)
        if stale is not None:
            self._vanish(stale, "replaced by a rename before it was closed")
        save = self._file_save(p, path, min(begin_ns, t), t, mono)
        self._activity(save, t, mono, sample=True)
        self._finish(save)

    def _file_save(self, p: Place, path: str, first_ns: int, t: int, mono: float) -> PendingSave:
        """A new save of the checkpoint file ``path``, begun at ``first_ns`` (last seen at ``t``), pending and
        recorded as begun."""
        save = PendingSave(
            root=p.root,
            key=path,
            is_dir=False,
            first_ns=first_ns,
            last_ns=t,
            last_mono=mono,
            name_step=step_of(os.path.basename(path)),
            confirmed=True,
        )
        self._saves[path] = save
        self._recorder.save_begin(save)
        return save

    def file_event(self, path: str, what: str, t: int, mono: float, syn: bool) -> None:
        """A file was created, modified (``what``: ``create``, ``modify``) or closed after writing (``close``)."""
        p = self.place(path, is_dir=False)
        if p is None:
            return
        if p.kind == "unit":
            unit = self._saves.get(p.key)
            if unit is None and what == "close":  # closed with no write seen: nothing was written
                return
            unit = self._unit(p, t, mono)
            if self._layout.counts(p.root, path):
                self._confirm(unit)
            self._track(unit, path, what, t, mono, syn)
        elif p.kind == "file":
            save = self._saves.get(path)
            if what == "create" and syn:  # it came with a directory moved in from outside: whole at that move
                if save is None:
                    self._atomic(p, path, t, t, mono)
                return
            if what == "create" and os.path.islink(path):  # a link to a save already counted
                return
            if save is None:
                if what == "close":
                    return
                save = self._file_save(p, path, t, t, mono)
            self._track(save, path, what, t, mono, syn)
            if what == "close":
                self._finish(save)
        else:
            self._firsts.stage(p.key if p.kind == "staging" else path, t, what, reset=p.kind == "other")

    def file_moved(self, src: str, dest: str, t: int, mono: float, syn: bool) -> None:
        """A file was renamed from ``src`` to ``dest`` (either empty: outside the watched directories)."""
        sp = self.place(src, is_dir=False) if src else None
        dp = self.place(dest, is_dir=False) if dest else None
        begin: int | None = None
        moved: PendingSave | None = None
        if sp is not None:
            if sp.kind == "file":
                moved = self._saves.pop(src, None)
            elif sp.kind == "unit":
                unit = self._saves.get(sp.key)
                if unit is not None:
                    unit.written.discard(src)
                    unit.created.pop(src, None)
                    unit.last_mono = mono
            elif sp.kind == "staging":
                rec = self._firsts.get(sp.key)  # kept: the rest of the directory may follow
                begin = rec.first_ns if rec is not None else None
            else:
                staged = self._firsts.take(src)
                begin = staged.first_ns if staged is not None else None
        if dp is not None and dp.kind == "file":
            if moved is not None:  # a save renamed while pending: continues under its new name
                moved.key, moved.root, moved.name_step = dest, dp.root, step_of(os.path.basename(dest))
                moved.written.discard(src)
                moved.created.pop(src, None)
                self._saves[dest] = moved
                if not syn:  # renamed itself: whole at the rename
                    self._activity(moved, t, mono, sample=True)
                    self._finish(moved)
            elif not syn or (sp is not None and sp.kind == "staging") or not src:
                self._atomic(dp, dest, t if begin is None else begin, t, mono)
            return  # else: a directory of checkpoints saved before was renamed; nothing new was written
        if moved is not None:
            self._vanish(
                moved, f"renamed to {dest or 'outside the watched directories'!r} before it was closed"
            )
        if dp is None:
            return
        if dp.kind == "unit":
            unit = self._unit(dp, t, mono)
            if begin is not None and not unit.begun:
                unit.first_ns = min(unit.first_ns, begin)
            if self._layout.counts(dp.root, dest):
                self._confirm(unit)
            unit.written.discard(dest)
            unit.created.pop(dest, None)
            if syn:
                unit.last_mono = mono
            else:
                self._activity(unit, t, mono, sample=True)
        else:
            key = dp.key if dp.kind == "staging" else dest
            self._firsts.keep_renamed(key, t if begin is None else begin, closed=True)

    def dir_created(self, path: str, t: int, mono: float, syn: bool) -> None:
        """A directory was created (``syn``: it came with a directory moved in)."""
        if not syn:
            self._firsts.dir_created(path, t)
        p = self.place(path, is_dir=True)
        if p is None:
            return
        if p.kind == "unit":
            if syn:
                unit = self._saves.get(p.key)
                if unit is not None:
                    unit.last_mono = mono
                return
            self._activity(self._unit(p, t, mono), t, mono, sample=False)
        elif p.kind == "staging":
            self._firsts.stage(p.key, t, "create", reset=False)

    def dir_moved(self, src: str, dest: str, t: int, mono: float, syn: bool) -> None:
        """A directory was renamed from ``src`` to ``dest`` (either empty: outside the watched directories):
        the saves in it move with it, or end incomplete where they are no checkpoint under the new name."""
        if syn:  # a subdirectory of a directory renamed: that rename was handled
            return
        if not dest:
            self.gone(src, True, mono, "moved out of the watched directories before it was judged")
            return
        prefix = src + os.sep if src else None

        def moved_path(x: str) -> str:
            return dest + x[len(src) :] if prefix is not None and (x == src or x.startswith(prefix)) else x

        for key in [k for k in self._saves if prefix is not None and (k == src or k.startswith(prefix))]:
            save = self._saves.pop(key)
            nk = moved_path(key)
            np = self.place(nk, is_dir=save.is_dir)
            save.written = {moved_path(w) for w in save.written}
            save.created = {moved_path(c): v for c, v in save.created.items()}
            if np is not None and np.kind == ("unit" if save.is_dir else "file") and np.key == nk:
                save.key, save.root, save.name_step = nk, np.root, self._layout.name_step(np.root, nk)
                self._saves[nk] = save
                self._activity(save, t, mono, sample=True)
            else:
                self._vanish(
                    save, f"renamed to {self._layout.rel(np.root, nk) if np else nk!r} before it was judged"
                )
        for save in self._saves.values():  # src inside a pending directory save
            if save.is_dir and prefix is not None and src.startswith(save.key + os.sep):
                save.written = {moved_path(w) for w in save.written}
                save.created = {moved_path(c): v for c, v in save.created.items()}
                save.last_mono = mono
        sp = self.place(src, is_dir=True) if src else None
        staged = self._firsts.get(sp.key) if sp is not None and sp.kind == "staging" else None
        dp = self.place(dest, is_dir=True)
        if dp is None:
            return
        if dp.kind == "unit":
            unit = self._unit(dp, t, mono)
            if staged is not None and not unit.begun:
                unit.first_ns = min(unit.first_ns, staged.first_ns)
            self._activity(unit, t, mono, sample=True)
        elif dp.kind == "staging":
            self._firsts.keep_renamed(dp.key, t if staged is None else staged.first_ns, closed=False)

    def gone(self, path: str, is_dir: bool, mono: float, reason: str) -> None:
        """``path`` was removed (or moved out): the saves of it or in it end incomplete (``reason``), the
        directory saves it was part of forget it."""
        prefix = path + os.sep
        if is_dir and path in self._layout.roots:
            self._recorder.root_removed(path)
        for key in [k for k in self._saves if k == path or (is_dir and k.startswith(prefix))]:
            self._vanish(self._saves.pop(key), reason)
        for save in self._saves.values():
            if save.is_dir and path.startswith(save.key + os.sep):
                save.written = {w for w in save.written if w != path and not w.startswith(prefix)}
                save.created = {
                    c: v for c, v in save.created.items() if c != path and not c.startswith(prefix)
                }
                save.last_mono = mono
        self._firsts.forget(path, is_dir)

    def _vanish(self, save: PendingSave, reason: str) -> None:
        """Write the end of a save that is gone (or replaced) before it was judged: incomplete, ``reason``
        why (nothing for a directory that never held a checkpoint)."""
        if save.is_dir and not save.confirmed:
            return
        if not save.begun:
            self._recorder.save_begin(save)
        step = self._recorder.end_step(save)
        self._recorder.save_end(save, step, complete=False, files=0, nbytes=0, incomplete=reason)

    def _finish(self, save: PendingSave) -> None:
        """Judge a save and write its end (and its begin, when not written yet)."""
        self._saves.pop(save.key, None)
        if save.is_dir:
            problems, files, nbytes, holds = judge_dir(save, self._layout, self._whole)
            if not (save.confirmed or holds):
                return  # a directory with a step in its name that never held a checkpoint
            save.confirmed = True
        else:
            problems, files, nbytes = judge_file(save, self._whole)
        if not save.begun:
            self._recorder.save_begin(save)
        step = self._recorder.end_step(save)
        self._saved_step[save.key] = step
        incomplete: str | None = None
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            incomplete = "; ".join(problems[:3]) + more
        self._recorder.save_end(
            save, step, complete=not problems, files=files, nbytes=nbytes, incomplete=incomplete
        )
