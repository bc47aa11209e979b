"""The ``serve-command`` workload without a balancer or locust: its options and their errors (file:line), the
replica's and the load's command lines, the balancer's plan and haproxy configuration for it, the load's
declared requests, and the shim's readiness poll against a real local HTTP server."""

from __future__ import annotations

import io
import json
import shutil
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import redirect_stderr
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from chaosbench.analysis.serving import out_of_service_s
from chaosbench.analysis.timeline_index import TimelineIndex
from chaosbench.errors import SpecError
from chaosbench.frameworks.balancer import BalancerOptions, haproxy_config
from chaosbench.launchers import command as shim
from chaosbench.probe import Probe
from chaosbench.registry import WORKLOADS
from chaosbench.runner import Runner
from chaosbench.specs import WorkloadSpec
from chaosbench.timeline import Event, read_events
from chaosbench.workloads import serve_load
from chaosbench.workloads.base import RunPaths, ServingWorkload
from chaosbench.workloads.serve import LOAD_PROGRAM, RequestLoadOptions
from chaosbench.workloads.serve_command import SHIM, ServeCommand, ServeCommandOptions
from tests.conftest import make_suite

SERVER = ["python3", "{project_dir}/server.py", "--port", "{port}", "--host", "{host}", "--replica", "{rank}"]
REQUESTS = [
    {"name": "predict", "method": "post", "path": "/v1/predict", "body": {"inputs": [[1, 2]]}, "weight": 4},
    {"method": "GET", "path": "/healthz"},
    {"name": "bad", "method": "POST", "path": "/v1/predict", "body": {"inputs": "x"}, "expect_status": 422},
]


def _workload(**options: Any) -> ServeCommand:
    opts = {"command": SERVER, "load": {"users": 3, "duration_s": 5, "requests": REQUESTS}, **options}
    spec = WorkloadSpec.model_validate({"name": "serve-command", "ranks": 2, **opts})
    return ServeCommand(spec, ServeCommandOptions.model_validate(spec.options, strict=True))


def test_registered_as_a_serving_workload() -> None:
    assert WORKLOADS.get("serve-command") is ServeCommand
    w = _workload()
    assert isinstance(w, ServingWorkload) and w.serves and w.users_script and not w.plants
    assert w.total_steps is None and w.init_argv(RunPaths(Path("r"), Path("c"), 1)) is None
    assert (w.health_path, w.health_status) == ("/health", 200)
    w = _workload(ready={"path": "/healthz", "expect_status": 204})
    assert (w.health_path, w.health_status) == ("/healthz", 204)


def test_replica_argv_is_the_shim_with_the_ready_check(tmp_path: Path) -> None:
    w = _workload(ready={"path": "/healthz", "interval_s": 0.2}, env={"MODEL_PORT": "{port}"})
    argv = w.argv(RunPaths(tmp_path, tmp_path / "ck", 3, project_dir="/proj"))
    assert argv[:3] == [sys.executable, "-m", SHIM]
    assert argv[argv.index("--") + 1 :] == SERVER
    ready = json.loads(argv[argv.index("--ready") + 1])
    assert ready == {"path": "/healthz", "expect_status": 200, "interval_s": 0.2, "timeout_s": 1.0}
    subst = json.loads(argv[argv.index("--subst") + 1])
    assert subst["project_dir"] == "/proj" and subst["work_dir"] == str(tmp_path / "work")
    assert json.loads(argv[argv.index("--env") + 1]) == {"MODEL_PORT": "{port}"}
    assert argv[argv.index("--cwd") + 1] == "{work_dir}"


def test_load_argv_round_trips_the_declared_requests() -> None:
    w = _workload(slo={"availability": 0.99, "recovery_window_s": 2})
    argv = w.load_argv("http://127.0.0.1:8100")
    assert argv[:3] == [sys.executable, "-m", LOAD_PROGRAM] and "--mix" not in argv
    parsed = serve_load.parse_args(argv[3:])
    assert parsed.load == w.options.load and parsed.slo == w.options.slo
    assert [r.label for r in parsed.load.requests] == ["predict", "GET /healthz", "bad"]
    assert [r.method for r in parsed.load.requests] == ["POST", "GET", "POST"]
    assert serve_load.mix_of(parsed.load) == {"predict": 4, "GET /healthz": 1, "bad": 1}


def test_declared_tasks_carry_their_weights_and_expected_statuses() -> None:
    load = RequestLoadOptions.model_validate({"requests": REQUESTS})
    started: Counter[str] = Counter()
    tasks, expect = serve_load.user_tasks(load, started)
    assert sorted(tasks.values()) == [1, 1, 4]
    assert expect == {"predict": 200, "GET /healthz": 200, "bad": 422}
    sent: list[tuple[str, str, dict[str, Any]]] = []

    class Client:
        def request(self, method: str, path: str, **kwargs: Any) -> None:
            sent.append((method, path, kwargs))

    user = type("U", (), {"client": Client()})()
    for task in tasks:
        task(user)
    assert sorted(sent, key=lambda s: str(s[2]["name"])) == [
        ("GET", "/healthz", {"name": "GET /healthz", "timeout": 2.0}),
        ("POST", "/v1/predict", {"name": "bad", "timeout": 2.0, "json": {"inputs": "x"}}),
        ("POST", "/v1/predict", {"name": "predict", "timeout": 2.0, "json": {"inputs": [[1, 2]]}}),
    ]
    assert started == Counter({"predict": 1, "GET /healthz": 1, "bad": 1})


def test_an_expected_status_decides_success() -> None:
    assert serve_load.error_kind(422, Exception("HTTPError"), expect=422) is None
    assert serve_load.error_kind(200, None, expect=422) == "200"
    assert serve_load.error_kind(201, None, expect=200) == "201"
    assert serve_load.error_kind(None, ConnectionRefusedError(), expect=200) == "ConnectionRefusedError"
    assert serve_load.error_kind(503, None) == "503" and serve_load.error_kind(201, None) is None


# ------------------------------------------------------------------------------------------------ errors


SUITE = """\
name: t
defaults:
  workload:
    name: serve-command
    ranks: 2
    command: {command}
    load:
      users: 2
      requests:
        - {{name: predict, method: POST, path: /predict, body: {{x: [1]}}}}
        - {request}
frameworks:
  lb: {{adapter: balancer}}
matrix:
  frameworks: [lb]
"""
GOOD_COMMAND = '[python3, "{project_dir}/s.py", --port, "{port}"]'


def _error(command: str = GOOD_COMMAND, request: str = "{method: GET, path: /health}") -> SpecError:
    with pytest.raises(SpecError) as ei:
        make_suite(SUITE.format(command=command, request=request), "suites/x.yaml")
    return ei.value


def test_the_good_suite_loads() -> None:
    suite = make_suite(
        SUITE.format(command=GOOD_COMMAND, request="{method: GET, path: /health}"), "suites/x.yaml"
    )
    assert [sc.workload.name for sc in suite.scenarios()] == ["serve-command"]


@pytest.mark.parametrize(
    ("command", "request_", "line", "problem"),
    [
        ('[python3, "{project_dir}/s.py"]', "{path: /h}", 6, "command: no {port}"),
        ('[python3, "{project_dir}/s.py", --port, "{prot}"]', "{path: /h}", 6, "unknown placeholder {prot}"),
        (GOOD_COMMAND, "{method: GET, path: health}", 11, "'health' is not a path from '/'"),
        (GOOD_COMMAND, "{method: FETCH, path: /h}", 11, "unknown HTTP method 'FETCH'"),
        (GOOD_COMMAND, "{path: /h, expect_status: 700}", 11, "expect_status"),
        (GOOD_COMMAND, "{path: /h, weight: 0}", 11, "weight"),
        (GOOD_COMMAND, "{path: /h, bogus: 1}", 11, "unknown option"),
        (GOOD_COMMAND, "{name: predict, path: /h}", 9, "two requests are named 'predict'"),
    ],
)
def test_bad_options_name_their_line(command: str, request_: str, line: int, problem: str) -> None:
    err = _error(command, request_)
    assert (err.file, err.line, err.obj) == ("suites/x.yaml", line, "workload 'serve-command'"), str(err)
    assert problem in err.problem, err.problem


def test_the_requests_are_required() -> None:
    text = SUITE.format(command=GOOD_COMMAND, request="{path: /h}").replace(
        "    load:\n      users: 2\n      requests:\n        - {name: predict, method: POST, path: /predict, "
        "body: {x: [1]}}\n        - {path: /h}\n",
        "    load: {users: 2}\n",
    )
    with pytest.raises(SpecError) as ei:
        make_suite(text, "suites/x.yaml")
    assert (ei.value.line, ei.value.problem) == (7, "load.requests: required option is missing")


def test_the_port_may_come_through_the_environment() -> None:
    _workload(command=["python3", "{project_dir}/s.py"], env={"PORT": "{port}"})
    with pytest.raises(ValueError, match="no {port}"):
        _workload(command=["python3", "{project_dir}/s.py"], cwd="/tmp/{port}")


# ------------------------------------------------------------------------------------------------ balancer


def test_haproxy_checks_the_workloads_health_path_and_status() -> None:
    o = BalancerOptions()
    text = haproxy_config(
        o, "127.0.0.1:8080", [(0, "127.0.0.1:9000")], "127.0.0.1:9999", None, "/healthz", 204
    )
    assert "option httpchk GET /healthz\n    http-check expect status 204\n" in text
    assert "http-check" not in haproxy_config(o, "127.0.0.1:8080", [(0, "127.0.0.1:9000")], "127.0.0.1:9999")


@pytest.mark.skipif(
    shutil.which("haproxy") is None, reason="the balancer plans only where haproxy is installed"
)
def test_the_balancer_plans_no_init_process(tmp_path: Path) -> None:
    suite = make_suite(SUITE.format(command=GOOD_COMMAND, request="{path: /h}"), "suites/x.yaml")
    ((_, plan),) = list(Runner(suite, tmp_path).plans())
    roles = [p.role for p in plan.processes]
    assert roles == ["rank", "rank", "balancer", "load"]
    replicas = [p for p in plan.processes if p.role == "rank"]
    assert [p.env["RANK"] for p in replicas] == ["0", "1"]
    assert all(p.argv[:3] == [sys.executable, "-m", SHIM] for p in replicas)
    assert len({p.env["SERVE_PORT"] for p in replicas}) == 2
    load = next(p for p in plan.processes if p.role == "load")
    assert "--requests" in load.argv


# ------------------------------------------------------------------------------------------------ readiness


class _Health(BaseHTTPRequestHandler):
    answers: list[int] = []

    def do_GET(self) -> None:
        status = self.answers.pop(0) if self.answers else 200
        self.send_response(status if self.path == "/healthz" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield server
    server.shutdown()
    server.server_close()


class _Child:
    def __init__(self, rc: int | None = None) -> None:
        self.rc = rc

    def poll(self) -> int | None:
        return self.rc


READY = {"path": "/healthz", "expect_status": 200, "interval_s": 0.01, "timeout_s": 1.0}


def test_ready_once_the_health_path_answers_the_expected_status(
    tmp_path: Path, health_server: ThreadingHTTPServer
) -> None:
    _Health.answers = [503, 503]
    port = health_server.server_address[1]
    events = tmp_path / "events.jsonl"
    probe = Probe(str(events), rank=1, world_size=2)
    err = io.StringIO()
    with redirect_stderr(err):
        shim.wait_ready(_Child(), probe, READY, "0.0.0.0", port, 0)  # type: ignore[arg-type]
    probe.close()
    ready = [e for e in read_events(events) if e.kind == "replica_ready"]
    assert [(e.get("rank"), e.get("address"), e.get("port")) for e in ready] == [(1, "0.0.0.0", port)]
    assert ready[0].get("url") == f"http://127.0.0.1:{port}/healthz"
    lines = err.getvalue().splitlines()
    # the two 503s are said once (one kind of answer), then the ready line
    url = f"http://127.0.0.1:{port}/healthz"
    assert lines[0] == f"chaosbench: replica 1 not ready yet: GET {url}: answered 503, expecting 200"
    assert lines[1].startswith(
        f"chaosbench: replica 1 ready: GET http://127.0.0.1:{port}/healthz answered 200"
    )
    assert len(lines) == 2 and _Health.answers == []


def test_no_ready_from_a_server_that_exited(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    probe = Probe(str(events), rank=0)
    shim.wait_ready(_Child(rc=1), probe, READY, "127.0.0.1", 1, 0)  # type: ignore[arg-type]
    probe.close()
    assert not events.exists() or not read_events(events)


def test_the_port_placeholder_needs_the_frameworks_port() -> None:
    assert shim.serve_values({"SERVE_PORT": "8001", "SERVE_HOST": "0.0.0.0"}) == {
        "port": "8001",
        "host": "0.0.0.0",
    }
    with pytest.raises(ValueError, match="SERVE_PORT"):
        shim.serve_values({})
    assert (shim.poll_host("0.0.0.0"), shim.poll_host("::"), shim.poll_host("10.0.0.2")) == (
        "127.0.0.1",
        "::1",
        "10.0.0.2",
    )


# ------------------------------------------------------------------------------------------------ metrics


def test_a_user_servers_own_exit_takes_its_replica_out() -> None:
    """Under the shim the runtime's process is the shim (its pid is no rank's): the server's ``rank_exit`` is
    what says the replica is gone, until its next incarnation is ready."""
    s = 1_000_000_000
    evs = [
        Event(0, "rank_start", "rank", data={"rank": 1, "pid": 500, "world_size": 2, "incarnation": 0}),
        Event(2 * s, "proc_exit", "runtime", data={"proc": "replica1.i0", "pid": 499, "returncode": 1}),
        Event(2 * s, "rank_exit", "rank", data={"rank": 1, "pid": 500, "returncode": 1, "incarnation": 0}),
        Event(5 * s, "replica_ready", "rank", data={"rank": 1, "incarnation": 1}),
    ]
    assert out_of_service_s(TimelineIndex(evs), 0, 10 * s) == (3.0, 1)


def test_the_workload_imports_neither_locust_nor_torch() -> None:
    """The harness loads it to plan a run: nothing heavy, and nothing that monkey-patches (locust)."""
    import subprocess

    code = (
        "import sys; import chaosbench.workloads.serve_command, chaosbench.launchers.command; "
        "loaded = [m for m in ('locust', 'gevent', 'torch', 'uvicorn', 'starlette') if m in sys.modules]; "
        "print(loaded); sys.exit(1 if loaded else 0)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


TINY_SERVER = """\
import os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/ok" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

server = HTTPServer((sys.argv[2], int(sys.argv[1])), H)
print(f"serving pid {os.getpid()} on {sys.argv[2]}:{sys.argv[1]}", flush=True)
server.serve_forever()
"""


def test_the_shim_runs_a_server_on_its_port_and_says_when_it_is_ready(tmp_path: Path) -> None:
    """The shim as a replica runs: {port} and {host} from the framework's variables, rank_start with the server's
    own pid, replica_ready once GET /ok answers 200; a SIGTERM reaches the server, and the shim dies of it too."""
    import os
    import signal
    import subprocess
    import time

    from tests.helpers import free_port

    (tmp_path / "server.py").write_text(TINY_SERVER)
    port = free_port()
    events = tmp_path / "events.jsonl"
    env = {
        **os.environ,
        "SERVE_PORT": str(port),
        "SERVE_HOST": "127.0.0.1",
        "RANK": "1",
        "WORLD_SIZE": "2",
        "CHAOSBENCH_EVENTS": str(events),
    }
    ready = json.dumps({"path": "/ok", "expect_status": 200, "interval_s": 0.05, "timeout_s": 1.0})
    argv = [
        sys.executable,
        "-m",
        SHIM,
        "--ready",
        ready,
        "--cwd",
        str(tmp_path),
        "--",
        sys.executable,
        "server.py",
        "{port}",
        "{host}",
    ]
    shim_proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not (events.exists() and any(e.kind == "replica_ready" for e in read_events(events))):
            assert shim_proc.poll() is None and time.monotonic() < deadline, "no replica_ready"
            time.sleep(0.05)
    finally:
        shim_proc.send_signal(signal.SIGTERM)
        out, err = shim_proc.communicate(timeout=30)
    assert shim_proc.returncode == -signal.SIGTERM, err
    evs = read_events(events)
    (start,) = [e for e in evs if e.kind == "rank_start"]
    (ready_ev,) = [e for e in evs if e.kind == "replica_ready"]
    (exit_ev,) = [e for e in evs if e.kind == "rank_exit"]
    served = out.decode().splitlines()[0]
    assert served == f"serving pid {start['pid']} on 127.0.0.1:{port}"
    assert (start["rank"], start["port"], start["address"], start["world_size"]) == (1, port, "127.0.0.1", 2)
    assert (ready_ev["rank"], ready_ev["port"], ready_ev["url"]) == (1, port, f"http://127.0.0.1:{port}/ok")
    assert start.t_ns <= ready_ev.t_ns <= exit_ev.t_ns
    assert (exit_ev["pid"], exit_ev["returncode"]) == (start["pid"], -signal.SIGTERM)
    assert f"chaosbench: replica 1 ready: GET http://127.0.0.1:{port}/ok answered 200" in err.decode()


def test_the_example_suite_runs_the_fixture_server() -> None:
    """suites/serving-own-server.yaml loads, and the server it names is the fixture (which imports nothing of
    chaosbench: it stands for the user's own)."""
    from chaosbench.specs import load_suite
    from tests.conftest import ROOT

    suite = load_suite(ROOT / "suites" / "serving-own-server.yaml")
    scenarios = suite.scenarios()
    assert len(scenarios) == 6 and {sc.workload.name for sc in scenarios} == {"serve-command"}
    opts = ServeCommandOptions.model_validate(scenarios[0].workload.options, strict=True)
    script = Path(opts.command[1].replace("{project_dir}", str(ROOT)))
    assert script == ROOT / "tests" / "fixtures" / "foreign" / "model_server.py" and script.is_file()
    assert "chaosbench" not in script.read_text().split('"""', 2)[2]
    assert (opts.ready.path, [r.label for r in opts.load.requests]) == (
        "/healthz",
        ["predict", "health", "bad-input"],
    )
