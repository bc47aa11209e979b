"""Where a run's files are, seen from a report in its suite directory: the directories a run may be in, and a
file's link relative to the report. Paths are strings (10,000 runs make Path objects cost)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from chaosbench.report.fmt import as_int, as_text
from chaosbench.rundir import dirname


def run_dir_candidates(suite_dir: str, row: Mapping[str, Any]) -> list[str]:
    """Where the run of results row ``row`` may be: the standard layout under the suite directory
    (:class:`chaosbench.rundir.RunDir`; right for a suite that was moved or copied), then ``run_dir`` as
    recorded, relative to the suite directory and then as it is."""
    out: list[str] = []
    scenario, repeat = as_text(row.get("scenario")), as_int(row.get("repeat"))
    if scenario and repeat is not None:
        out.append(os.path.join(suite_dir, dirname(scenario), str(repeat)))
    recorded = as_text(row.get("run_dir"))
    if recorded:
        if not os.path.isabs(recorded):
            out.append(os.path.join(suite_dir, recorded))
        out.append(recorded)
    return list(dict.fromkeys(out))


def href(path: str, suite_dir: str) -> str:
    """``path``'s link from the report in ``suite_dir`` (both absolute): its path relative to ``suite_dir`` as a
    URL path (``/``-separated, percent-quoted)."""
    if path.startswith(suite_dir + os.sep):
        rel = path[len(suite_dir) + 1 :]
    else:
        try:
            rel = os.path.relpath(path, suite_dir)
        except ValueError:  # another drive (Windows): only an absolute link can reach it
            return Path(path).resolve().as_uri()
    return quote(rel.replace(os.sep, "/"))
