"""The default node image of the ``docker`` runtime, assembled from local files (no registry is needed).

The image itself is (almost) empty: a tar holding only the top-level layout of this host (``bin -> usr/bin``
style symlinks where the host has merged ``/usr``, empty mount points elsewhere), imported with
``docker import``. What a node runs comes from this host, bind-mounted read-only when the container is
created (:func:`default_mounts`): the system directories (``/usr``, ``/etc`` and, where they are real
directories, ``/bin``, ``/sbin``, ``/lib``, ``/lib64``), the Python installation that runs the harness
(``sys.base_prefix``), its virtualenv (``sys.prefix``) and the source tree of an editable install of
chaosbench. A node therefore runs exactly the interpreter, torch and chaosbench of the harness, at the same
paths, so a launch plan's ``argv`` works unchanged inside the container. ``/tmp`` is a tmpfs.

The image's tag carries chaosbench's version and a fingerprint of the host layout it was built for;
``chaosbench image build`` (or the runtime, when the image is missing) builds it in well under a second.

A user's own image (``runtime_options: {image: NAME}``) is used as is and gets none of these mounts; see
``docs/docker.md``.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaosbench import __version__
from chaosbench.errors import EngineError, MissingEngine

DEFAULT_REPOSITORY = "chaosbench/local"
#: Label on the default image (and the value ``docker images --filter label=chaosbench.image`` finds).
IMAGE_LABEL = "chaosbench.image"
#: Top-level names that are either symlinks into /usr (merged-/usr hosts) or directories mounted read-only.
SYSTEM_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
#: Always mounted read-only when present.
ALWAYS_MOUNTED = ("/usr", "/etc")
#: Empty directories the image must have (mount points and the usual top level).
EMPTY_DIRS = ("usr", "etc", "tmp", "proc", "sys", "dev", "root", "run", "var", "home", "opt", "mnt", "srv")


@dataclass(frozen=True)
class BindMount:
    """One host path mounted into a node at the same path."""

    source: str
    target: str
    read_only: bool = True

    def to_docker(self) -> Any:
        from docker.types import Mount

        return Mount(target=self.target, source=self.source, type="bind", read_only=self.read_only)


def host_layout(root: str = "/") -> dict[str, str | None]:
    """For each of :data:`SYSTEM_DIRS` present on the host: its symlink target, or None for a real directory."""
    out: dict[str, str | None] = {}
    for name in SYSTEM_DIRS:
        p = os.path.join(root, name)
        if os.path.islink(p):
            out[name] = os.readlink(p)
        elif os.path.isdir(p):
            out[name] = None
    return out


def default_image_tag(layout: dict[str, str | None] | None = None) -> str:
    """``chaosbench/local:<version>-<fingerprint of the host layout>``."""
    layout = host_layout() if layout is None else layout
    digest = hashlib.sha256(repr(sorted(layout.items())).encode()).hexdigest()[:10]
    return f"{DEFAULT_REPOSITORY}:{__version__}-{digest}"


def base_tar(layout: dict[str, str | None] | None = None) -> bytes:
    """The image's only layer: the host's top-level symlinks and empty mount points."""
    layout = host_layout() if layout is None else layout
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in EMPTY_DIRS + tuple(n for n, link in layout.items() if link is None):
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if name == "tmp" else 0o755
            tar.addfile(info)
        for name, link in layout.items():
            if link is not None:
                info = tarfile.TarInfo(name)
                info.type = tarfile.SYMTYPE
                info.linkname = link
                tar.addfile(info)
    return buf.getvalue()


def _package_root() -> str:
    """The directory holding the ``chaosbench`` package (the source tree of an editable install)."""
    import chaosbench

    return str(Path(chaosbench.__file__).resolve().parent.parent)


def default_mounts() -> list[BindMount]:
    """Read-only mounts that make a default-image node run this host's Python, torch and chaosbench."""
    paths: list[str] = [p for p in ALWAYS_MOUNTED if os.path.isdir(p)]
    paths += [f"/{n}" for n, link in host_layout().items() if link is None]
    for p in (sys.base_prefix, sys.prefix, sys.exec_prefix, _package_root()):
        real = os.path.realpath(p)
        paths.append(real)
        if real != p:
            paths.append(p)  # the path as the interpreter reports it (a symlinked prefix)
    # Most general first, so nested paths already covered are dropped.
    kept: list[str] = []
    for p in sorted(set(paths), key=lambda s: (s.count("/"), s)):
        if not os.path.isdir(p) or p == "/":
            continue
        if any(p == k or p.startswith(k.rstrip("/") + "/") for k in kept):
            continue
        kept.append(p)
    return [BindMount(p, p, True) for p in kept]


def connect(timeout_s: float = 30.0) -> Any:
    """A Docker SDK client for the local engine; raises :class:`MissingEngine` when none answers."""
    try:
        import docker
    except ImportError:
        raise MissingEngine(
            "the docker runtime needs the Docker SDK: pip install 'chaosbench[docker]'"
        ) from None
    try:
        client = docker.from_env(timeout=int(timeout_s), max_pool_size=64)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure to reach the engine means the same thing here
        raise MissingEngine(
            f"no Docker engine answers ({type(exc).__name__}: {exc}); start dockerd (scripts/docker-up)"
        ) from None
    return client


def image_exists(client: Any, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def build_default_image(client: Any | None = None, force: bool = False) -> str:
    """Import the default image (see the module docstring) unless it exists; returns its tag."""
    client = connect() if client is None else client
    layout = host_layout()
    tag = default_image_tag(layout)
    if not force and image_exists(client, tag):
        return tag
    repo, _, version = tag.partition(":")
    try:
        client.api.import_image_from_data(
            base_tar(layout),
            repository=repo,
            tag=version,
            changes=[
                f"LABEL {IMAGE_LABEL}=default",
                f"LABEL chaosbench.version={__version__}",
                "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            ],
        )
    except Exception as exc:  # noqa: BLE001 - the engine's error, as one line
        raise EngineError("docker", f"cannot build the default image {tag}: {exc}") from None
    if not image_exists(client, tag):
        raise EngineError("docker", f"docker import did not produce {tag}")
    return tag


def init_command() -> list[str]:
    """The default image's PID 1: tini (shipped with docker.io as the engine's ``--init``) reaping orphans
    around ``sleep infinity``; plain ``sleep infinity`` where the host has no tini. Docker's own ``--init``
    cannot be used with this image: it bind-mounts into ``/sbin``, which is a read-only host mount here."""
    for tini in ("/usr/bin/tini", "/usr/bin/tini-static", "/usr/sbin/tini"):
        if os.access(tini, os.X_OK):
            return [tini, "-s", "--", "sleep", "infinity"]
    return ["sleep", "infinity"]


def main_build(force: bool = False) -> int:
    """``chaosbench image build``: print the tag of the (possibly just built) default image."""
    tag = build_default_image(force=force)
    print(tag)
    for m in default_mounts():
        print(f"  mounted read-only at run time: {m.source}", file=sys.stderr)
    return 0
