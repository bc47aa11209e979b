"""One replica of the ``serve`` workload: a small torch MLP loaded from a checkpoint file, served over HTTP
(uvicorn + starlette); with ``--init-model``, the program that writes that file.

Run (the harness builds these from :class:`chaosbench.workloads.serve.Serve`)::

    python -m chaosbench.workloads.serve_replica --init-model --model-file CKPT/model.pt --hidden 64 --layers 2 --seed 0
    SERVE_HOST=127.0.0.1 SERVE_PORT=8101 RANK=1 WORLD_SIZE=2 \\
        python -m chaosbench.workloads.serve_replica --model-file CKPT/model.pt --hidden 64 --layers 2 --seed 0

Contract (what the harness relies on):

- ``--init-model`` builds the model from ``--seed`` and writes its state dict with ``torch.save`` to
  ``--model-file``: into a temporary file beside it (``.model.pt.tmp.<pid>``), fsync, rename, fsync of the
  directory, bracketed by the probe's ``ckpt_save_begin``/``ckpt_save_end`` (step 0, ``complete: true`` once
  renamed), so corrupt-checkpoint (``file_glob: model.pt``) and stall-fs find it. It emits no ``rank_start``: it
  is not a replica. Exit 0 once written.
- A replica emits ``rank_start`` (with ``address`` and ``port``: where it will listen) first, then loads the
  model: ``model_load_begin`` {path}; the planted faults' hooks (the load is the replica's step
  :data:`LOAD_STEP`: a ``crash-loop`` with ``at_step: 1`` raises here in every incarnation, the other
  process-level faults fire here once per run, an ``sdc`` with ``where: param`` corrupts the loaded parameters);
  ``--load-delay-s`` of sleep; the file read whole and ``torch.load(weights_only=True)``; ``load_state_dict``
  (strict); ``model_load_end`` {path, bytes, duration_s, digest (sha256 of the parameters), finite (bool: every
  parameter finite)}. A planted fault that cannot fire in a replica (another ``at_step``, gradients, a
  collective) gets a ``fault_skipped`` event with the reason. A failed load raises: the process exits non-zero
  with the traceback on stderr.
- Then it listens on ``SERVE_HOST:SERVE_PORT`` (``--host``/``--port``) and, once listening, emits
  ``replica_ready`` {address, port, url} and prints ``replica <rank> ready on http://host:port ...``. Nothing
  listens while the model loads (a health check there is refused, not answered). (``address``, not ``host``:
  an event's ``host`` is the machine whose clock stamped it.)
- Endpoints: ``GET /health`` 200 ``{"status": "ok", "replica": rank}`` (a health-check connection closed early
  or reset is the server's routine); ``POST /predict`` ``{"x": [IN_FEATURES floats]}`` -> 200 ``{"y":
  [OUT_FEATURES floats], "replica": rank}``, 400 for a malformed body, 500 when the output is not finite (a
  corrupted model); ``GET /info``: the replica's rank, incarnation, pid, model file, digest, sizes.
- Inference runs under ``torch.no_grad()`` with ``torch.set_num_threads(1)``. SIGTERM or SIGINT: uvicorn
  stops accepting, finishes the requests in flight, and the process dies of the signal.

Standard library at import (``serve_load`` imports :data:`IN_FEATURES`); torch, starlette and uvicorn inside
the functions.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chaosbench.probe import Probe
from chaosbench.workloads.planted import Planted, desync_of
from chaosbench.workloads.skeleton import mix_seed

#: Width of a request's input and of the model's output.
IN_FEATURES = 16
OUT_FEATURES = 4
#: The planted faults' step at which a replica loads its model (a replica has no training steps).
LOAD_STEP = 1
#: Seed tag of the model's initialization (mixed with ``--seed``).
MODEL_SEED_TAG = 0x7365727665
#: The planted injectors whose faults fire in :meth:`Planted.before_step` (so at the model load).
_PROCESS_FAULTS = frozenset({"crash-loop", "segfault", "abort", "thread-exception", "gil-hold", "oom"})

PROGRAM = "chaosbench.workloads.serve_replica"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m {PROGRAM}",
        description="One replica of the serve workload, or (--init-model) the writer of its model file.",
    )
    p.add_argument("--model-file", required=True, help="the model checkpoint (torch.save of a state dict)")
    p.add_argument("--hidden", type=int, default=64, help="hidden width of the MLP (default: 64)")
    p.add_argument("--layers", type=int, default=2, help="hidden layers of the MLP (default: 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model's initialization (default: 0)")
    p.add_argument(
        "--load-delay-s",
        type=float,
        default=0.0,
        help="sleep at the start of each model load, before the file is read (default: 0)",
    )
    p.add_argument("--init-model", action="store_true", help="write the model file and exit (no server)")
    p.add_argument(
        "--host",
        default=os.environ.get("SERVE_HOST", "127.0.0.1"),
        help="bind address (default: $SERVE_HOST, else 127.0.0.1)",
    )
    port = os.environ.get("SERVE_PORT")
    p.add_argument(
        "--port", type=int, default=int(port) if port else None, help="port (default: $SERVE_PORT)"
    )
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from pydantic import ValidationError

    from chaosbench.workloads.serve import ServeOptions

    p = parser()
    args = p.parse_args(argv)
    try:
        ServeOptions.model_validate(
            {"hidden": args.hidden, "layers": args.layers, "load_delay_s": args.load_delay_s}
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        p.error(f"--{str(err['loc'][0]).replace('_', '-')}: {err['msg']}")
    if not args.init_model and args.port is None:
        p.error("no port: set SERVE_PORT or give --port")
    return args


def build_model(hidden: int, layers: int) -> Any:
    """The served MLP: ``layers`` hidden Linear+ReLU layers of width ``hidden``, IN_FEATURES -> OUT_FEATURES."""
    from torch import nn

    mods: list[nn.Module] = []
    width = IN_FEATURES
    for _ in range(layers):
        mods += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    mods.append(nn.Linear(width, OUT_FEATURES))
    return nn.Sequential(*mods)


def params_digest(model: Any) -> str:
    """sha256 over each parameter's name and raw bytes (in ``named_parameters`` order)."""
    import torch

    h = hashlib.sha256()
    for name, param in model.named_parameters():
        h.update(name.encode())
        h.update(param.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------ the model file


def write_model(args: argparse.Namespace, probe: Probe) -> int:
    """``--init-model``: write the seeded model's state dict to ``--model-file`` atomically (see the module
    docstring)."""
    import torch

    torch.manual_seed(mix_seed(args.seed, MODEL_SEED_TAG))
    model = build_model(args.hidden, args.layers)
    path = Path(args.model_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    # beside the target (same filesystem: the rename is atomic), named so no '*.pt' glob matches it
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    with probe.ckpt_save(0, str(path)) as info:
        try:
            with open(tmp, "wb") as f:
                torch.save(model.state_dict(), f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        info["complete"] = True
    print(f"wrote model {path} ({path.stat().st_size} bytes, digest {params_digest(model)})", flush=True)
    return 0


def skip_unfireable(planted: Planted, probe: Probe) -> None:
    """A ``fault_skipped`` event for each of this replica's planted faults that cannot fire at its model load."""
    for plant in planted.plants:
        reason = None
        if (
            plant.injector == "collective-hang"
            and desync_of(str(plant.params.get("mode", "block")), plant.params.get("mismatch")) is not None
        ):
            reason = "a replica runs no collectives"
        elif plant.injector == "sdc" and plant.params.get("where", "grad") != "param":
            reason = "a replica computes no gradients and saves no checkpoint (only where: param fires, at the load)"
        elif plant.injector not in _PROCESS_FAULTS | {"collective-hang", "sdc"}:
            reason = f"a replica has no hook for {plant.injector}"
        elif plant.at_step != LOAD_STEP:
            reason = f"a replica's only step is its model load (at_step: {LOAD_STEP}), not {plant.at_step}"
        if reason is not None:
            probe.emit("fault_skipped", fault=plant.fault, injector=plant.injector, reason=reason)
            print(
                f"planted fault {plant.fault} ({plant.injector}) cannot fire here: {reason}",
                file=sys.stderr,
                flush=True,
            )


def load_model(args: argparse.Namespace, probe: Probe, planted: Planted) -> tuple[Any, dict[str, Any]]:
    """Load the model file (the replica's step :data:`LOAD_STEP` for the planted hooks); returns the model in
    eval mode and the ``model_load_end`` fields. Raises on any failure (unreadable, truncated, wrong shapes)."""
    import torch

    path = str(args.model_file)
    probe.emit("model_load_begin", path=path)
    t0 = time.perf_counter()
    planted.before_step(LOAD_STEP)
    if args.load_delay_s > 0:
        time.sleep(args.load_delay_s)
    with open(path, "rb") as f:
        data = f.read()
    state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    model = build_model(args.hidden, args.layers)
    model.load_state_dict(state)
    model.eval()
    planted.after_update(LOAD_STEP, list(model.parameters()))
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    info = {
        "path": path,
        "bytes": len(data),
        "duration_s": time.perf_counter() - t0,
        "digest": params_digest(model),
        "finite": finite,
    }
    probe.emit("model_load_end", **info)
    return model, info


# ------------------------------------------------------------------------------------------------ the server


def make_app(model: Any, meta: dict[str, Any]) -> Any:
    """The starlette app: /health, /predict, /info (see the module docstring)."""
    import torch
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    replica = meta["replica"]

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "replica": replica})

    async def info(request: Request) -> JSONResponse:
        return JSONResponse(meta)

    async def predict(request: Request) -> JSONResponse:
        try:
            body = await request.json()
            x = body["x"]
            if (
                not isinstance(x, list)
                or len(x) != IN_FEATURES
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in x)
            ):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            return JSONResponse(
                {"error": f'expected {{"x": [{IN_FEATURES} numbers]}}', "replica": replica}, status_code=400
            )
        # a tiny model: computed on the event loop's thread (no thread pool hop)
        with torch.no_grad():
            y = model(torch.tensor([x], dtype=torch.float32))[0].tolist()
        if not all(math.isfinite(v) for v in y):
            return JSONResponse(
                {"error": "the model's output is not finite", "replica": replica}, status_code=500
            )
        return JSONResponse({"y": y, "replica": replica})

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/predict", predict, methods=["POST"]),
        Route("/info", info, methods=["GET"]),
    ]
    return Starlette(routes=routes)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def serve(args: argparse.Namespace, probe: Probe) -> int:
    """A replica: rank_start, load the model, listen, replica_ready, serve until a signal."""
    probe.rank_start(address=args.host, port=args.port)
    planted = Planted(probe)
    skip_unfireable(planted, probe)
    import torch
    import uvicorn

    torch.set_num_threads(1)
    model, loaded = load_model(args, probe, planted)
    meta = {
        "replica": probe.rank,
        "incarnation": probe.incarnation,
        "pid": os.getpid(),
        "model_file": loaded["path"],
        "digest": loaded["digest"],
        "finite": loaded["finite"],
        "hidden": args.hidden,
        "layers": args.layers,
        "load_duration_s": loaded["duration_s"],
    }

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:
                probe.emit(
                    "replica_ready",
                    address=args.host,
                    port=args.port,
                    url=f"http://{_url_host(args.host)}:{args.port}",
                )
                print(
                    f"replica {probe.rank} ready on http://{_url_host(args.host)}:{args.port} (incarnation "
                    f"{probe.incarnation}, model {loaded['path']}, digest {loaded['digest'][:12]})",
                    flush=True,
                )

    config = uvicorn.Config(
        make_app(model, meta),
        host=args.host,
        port=args.port,
        loop="asyncio",
        http="h11",
        lifespan="off",
        access_log=False,
        log_level="warning",
        timeout_keep_alive=5,
    )
    Server(config).run()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    probe = Probe.from_env()
    try:
        return write_model(args, probe) if args.init_model else serve(args, probe)
    finally:
        probe.close()


if __name__ == "__main__":
    sys.exit(main())
