"""The default image's mounts (no engine needed): a node must see this host's Python and chaosbench."""

from __future__ import annotations

import sys
from pathlib import Path

import chaosbench
from chaosbench.runtimes.docker.image import default_mounts


def _covered(path: str, mounts: list[str]) -> bool:
    return any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts)


def test_default_mounts_cover_the_interpreter_and_the_package() -> None:
    """An editable install imports chaosbench from its source tree, which must be mounted too (it once mounted
    chaosbench/runtimes instead, and a node of a dev checkout could not import chaosbench)."""
    mounts = [m.source for m in default_mounts()]
    assert all(m.read_only for m in default_mounts())
    package = Path(chaosbench.__file__).resolve().parent
    assert _covered(str(package), mounts), (package, mounts)
    assert _covered(str(Path(sys.executable).resolve().parent), mounts) or _covered(sys.prefix, mounts)
    assert "/" not in mounts
