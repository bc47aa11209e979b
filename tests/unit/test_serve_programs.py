"""The serve workload's programs without a server or locust: options, command lines, the load's windows and its
target check, and the model file written and loaded in-process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from chaosbench.probe import Probe
from chaosbench.registry import WORKLOADS
from chaosbench.specs import WorkloadSpec
from chaosbench.workloads import serve_load, serve_replica
from chaosbench.workloads.base import RunPaths
from chaosbench.workloads.planted import Planted, PlantedFault
from chaosbench.workloads.serve import LOAD_PROGRAM, MODEL_FILE_NAME, REPLICA_PROGRAM, Serve, ServeOptions
from chaosbench.workloads.serve_load import (
    LATENCY_EDGES_MS,
    TargetRefused,
    WindowAggregator,
    check_target,
    error_kind,
    nearest_rank,
)
from tests.conftest import make_suite

MS = 1_000_000


def _workload(**options: Any) -> Serve:
    spec = WorkloadSpec.model_validate({"name": "serve", "ranks": 2, **options})
    return Serve(spec, ServeOptions.model_validate(spec.options))


def _run(tmp_path: Path) -> RunPaths:
    return RunPaths(run_dir=tmp_path, ckpt_dir=tmp_path / "ckpt", seed=7)


# ------------------------------------------------------------------------------------------------ options


def test_serve_is_registered_and_has_no_steps() -> None:
    assert WORKLOADS.get("serve") is Serve
    w = _workload()
    assert w.total_steps is None and w.pg_timeout_s is None and Serve.plants


@pytest.mark.parametrize(
    ("options", "where"),
    [
        ({"load": {"users": 0}}, "users"),
        ({"load": {"duration_s": 0}}, "duration_s"),
        ({"load": {"mix": {"predict": 0}}}, "weight must be > 0"),
        ({"load": {"mix": {"predcit": 1}}}, "unknown endpoint 'predcit'"),
        ({"load": {"mix": {}}}, "names no endpoint"),
        ({"load": {"window_ms": 0}}, "window_ms"),
        ({"load": {"max_requests": 0}}, "max_requests"),
        ({"load": {"spawn_rate": 0}}, "spawn_rate"),
        ({"load": {"request_timeout_s": 0}}, "request_timeout_s"),
        ({"slo": {"availability": 1.0}}, "availability"),
        ({"slo": {"availability": 0}}, "availability"),
        ({"slo": {"error_rate": 1.0}}, "error_rate"),
        ({"slo": {"recovery_window_s": 0}}, "recovery_window_s"),
        ({"hidden": 0}, "hidden"),
        ({"load_delay_s": -1}, "load_delay_s"),
        ({"bogus": 1}, "bogus"),
        ({"load": {"users": 2, "bogus": 1}}, "bogus"),
    ],
)
def test_bad_options_are_refused(options: dict[str, Any], where: str) -> None:
    with pytest.raises(ValidationError) as ei:
        ServeOptions.model_validate(options)
    assert where in str(ei.value)


def test_a_suite_names_the_bad_option_and_its_line() -> None:
    text = """\
    name: t
    defaults:
      workload: {name: serve, ranks: 2, load: {users: 0}}
    frameworks:
      none: {}
    matrix:
      frameworks: [none]
    """
    with pytest.raises(Exception, match=r"x\.yaml:3: workload 'serve': load\.users"):
        make_suite(text, "x.yaml")


# ------------------------------------------------------------------------------------------------ command lines


def test_replica_and_init_argv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = _workload(hidden=32, layers=3, load_delay_s=0.5)
    run = _run(tmp_path)
    assert w.model_file(run) == tmp_path / "ckpt" / MODEL_FILE_NAME
    argv = w.argv(run)
    assert argv[:3] == [sys.executable, "-m", REPLICA_PROGRAM]
    assert argv[3:] == [
        "--model-file",
        str(tmp_path / "ckpt" / "model.pt"),
        "--hidden",
        "32",
        "--layers",
        "3",
        "--seed",
        "7",
        "--load-delay-s",
        "0.5",
    ]
    init = w.init_argv(run)
    assert (
        init[:4] == [sys.executable, "-m", REPLICA_PROGRAM, "--init-model"] and "--load-delay-s" not in init
    )
    # the replica's own parser reads them back (the port from the environment, as the framework sets it)
    monkeypatch.setenv("SERVE_PORT", "8123")
    monkeypatch.setenv("SERVE_HOST", "127.0.0.2")
    args = serve_replica.parse_args(argv[3:])
    assert (args.model_file, args.hidden, args.layers, args.seed, args.load_delay_s, args.init_model) == (
        str(w.model_file(run)),
        32,
        3,
        7,
        0.5,
        False,
    )
    assert (args.host, args.port) == ("127.0.0.2", 8123)
    assert serve_replica.parse_args(init[3:]).init_model


def test_replica_without_a_port_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERVE_PORT", raising=False)
    with pytest.raises(SystemExit) as ei:
        serve_replica.parse_args(["--model-file", "m.pt"])
    assert ei.value.code == 2
    assert serve_replica.parse_args(["--model-file", "m.pt", "--init-model"]).init_model


def test_load_argv_round_trips_through_the_load_programs_parser() -> None:
    w = _workload(
        load={
            "users": 7,
            "spawn_rate": 3.5,
            "duration_s": 12,
            "mix": {"predict": 5, "info": 2},
            "wait_s": 0,
            "request_timeout_s": 0.75,
            "window_ms": 250,
            "max_requests": 999,
        },
        slo={"availability": 0.99, "window_days": 7, "error_rate": 0.05, "recovery_window_s": 2},
    )
    argv = w.load_argv("http://127.0.0.1:8100", allow_cidrs=["172.18.0.0/16"])
    assert argv[:5] == [sys.executable, "-m", LOAD_PROGRAM, "--target", "http://127.0.0.1:8100"]
    assert argv[-2:] == ["--allow-cidr", "172.18.0.0/16"]
    parsed = serve_load.parse_args(argv[3:])
    assert parsed.target == "http://127.0.0.1:8100" and parsed.allow_cidrs == ["172.18.0.0/16"]
    assert parsed.load == w.options.load and parsed.slo == w.options.slo
    # defaults of the program are the workload's defaults
    bare = serve_load.parse_args(["--target", "http://127.0.0.1:1"])
    assert bare.load == ServeOptions().load and bare.slo == ServeOptions().slo


def test_load_program_refuses_bad_options() -> None:
    with pytest.raises(SystemExit) as ei:
        serve_load.parse_args(["--target", "http://127.0.0.1:1", "--mix", "predict=9,nope=1"])
    assert ei.value.code == 2
    with pytest.raises(SystemExit):
        serve_load.parse_args(["--target", "http://127.0.0.1:1", "--mix", "predict"])
    assert serve_load.parse_mix("predict=9, health=1") == {"predict": 9, "health": 1}


def test_modules_import_neither_locust_nor_torch() -> None:
    """locust monkey-patches whatever imports it: only serve_load's main may; torch loads inside the replica."""
    code = (
        "import sys; import chaosbench.workloads.serve, chaosbench.workloads.serve_load, "
        "chaosbench.workloads.serve_replica; "
        "loaded = [m for m in ('locust', 'gevent', 'torch', 'uvicorn', 'starlette') if m in sys.modules]; "
        "print(loaded); sys.exit(1 if loaded else 0)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


# ------------------------------------------------------------------------------------------------ windows


def test_latency_edges_are_log_spaced_from_1_ms_to_30_s() -> None:
    assert LATENCY_EDGES_MS[0] == 1.0 and LATENCY_EDGES_MS[-1] >= 30_000
    ratios = [b / a for a, b in zip(LATENCY_EDGES_MS, LATENCY_EDGES_MS[1:], strict=False)]
    assert min(ratios) > 1.1 and max(ratios) < 1.14


def test_windows_count_requests_where_they_completed_and_keep_empty_ones() -> None:
    agg = WindowAggregator(start_ns=1_000 * MS, window_ns=100 * MS, edges_ms=[1.0, 10.0, 100.0])
    agg.add(1_000 * MS + 5 * MS, 0.5, None)  # window 0
    agg.add(1_000 * MS + 99 * MS, 20.0, None)  # window 0
    agg.add(1_000 * MS + 100 * MS, 3.0, "502")  # window 1 (its first instant)
    agg.add(1_000 * MS + 350 * MS, 5.0, None)  # window 3
    assert agg.close_until(1_000 * MS + 99 * MS) == []
    first = agg.close_until(1_000 * MS + 250 * MS)
    assert [w["t_ns"] for w in first] == [1_000 * MS, 1_100 * MS]
    w0, w1 = first
    assert (w0["requests"], w0["failures"], w0["errors"], w0["window_s"]) == (2, 0, {}, 0.1)
    assert w0["latency_hist"] == [1, 0, 1, 0] and w0["p50_ms"] == 0.5 and w0["max_ms"] == 20.0
    assert (w1["requests"], w1["failures"], w1["errors"]) == (1, 1, {"502": 1})
    assert w1["latency_hist"] == [0, 0, 0, 0] and w1["p50_ms"] is None and w1["max_ms"] is None
    # a stamp inside a window already returned counts in the oldest open one
    agg.add(1_000 * MS + 150 * MS, 2.0, "ConnectionRefusedError")
    rest = agg.finish(1_000 * MS + 420 * MS)
    assert [w["t_ns"] for w in rest] == [1_200 * MS, 1_300 * MS, 1_400 * MS]
    assert [w["requests"] for w in rest] == [1, 1, 0]  # the late one in window 2, the empty tail kept
    assert rest[0]["errors"] == {"ConnectionRefusedError": 1}
    assert rest[-1]["window_s"] == pytest.approx(0.02)
    assert (agg.requests, agg.failures) == (5, 2)


def test_finish_on_a_window_boundary_emits_no_empty_window() -> None:
    agg = WindowAggregator(start_ns=0, window_ns=100 * MS)
    agg.add(50 * MS, 1.0, None)
    out = agg.finish(200 * MS)
    assert [w["t_ns"] for w in out] == [0, 100 * MS] and [w["window_s"] for w in out] == [0.1, 0.1]
    # a request filed after the end counts in the last window instead of being lost
    agg2 = WindowAggregator(start_ns=0, window_ns=100 * MS)
    agg2.add(250 * MS, 1.0, None)
    out2 = agg2.finish(120 * MS)
    assert [w["requests"] for w in out2] == [0, 1] and out2[-1]["window_s"] == pytest.approx(0.02)


def test_histogram_bins_follow_the_edges() -> None:
    agg = WindowAggregator(start_ns=0, window_ns=MS * 1000)
    for v in (0.2, 1.0, 1.05, 30_000.0, 99_999.0):
        agg.add(1, v, None)
    (w,) = agg.finish(MS * 1000)
    hist = w["latency_hist"]
    assert len(hist) == len(LATENCY_EDGES_MS) + 1 and sum(hist) == 5
    assert (
        hist[0] == 1 and hist[1] == 2 and hist[-1] == 1
    )  # below 1 ms, [1, 1.12) ms, at or above the last edge


def test_quantiles_by_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert nearest_rank(values, 0.5) == 50.0 and nearest_rank(values, 0.99) == 99.0
    assert nearest_rank(values, 1.0) == 100.0 and nearest_rank([], 0.5) is None
    assert nearest_rank([7.0], 0.99) == 7.0


def test_error_kinds() -> None:
    assert error_kind(200, None) is None
    assert error_kind(502, Exception("502 Server Error")) == "502"
    assert error_kind(None, ConnectionRefusedError(111, "refused")) == "ConnectionRefusedError"
    assert error_kind(200, TimeoutError()) == "TimeoutError"  # a success status with an exception still fails


# ------------------------------------------------------------------------------------------------ target check


@pytest.mark.parametrize("url", ["http://127.0.0.1:8100", "http://127.9.8.7:1", "http://[::1]:8100"])
def test_loopback_targets_pass(url: str) -> None:
    assert check_target(url)


def test_other_targets_need_their_network_named() -> None:
    with pytest.raises(TargetRefused, match="10.1.2.3 is not in an allowed network"):
        check_target("http://10.1.2.3:80")
    assert check_target("http://10.1.2.3:80", ["10.1.0.0/16"]) == ["10.1.2.3"]
    with pytest.raises(TargetRefused):
        check_target("http://10.2.0.1:80", ["10.1.0.0/16"])
    with pytest.raises(TargetRefused, match="expected http://host:port"):
        check_target("https://127.0.0.1:443")
    with pytest.raises(TargetRefused, match="--allow-cidr"):
        check_target("http://127.0.0.1:1", ["not-a-net"])


def test_host_names_are_resolved_and_every_address_checked() -> None:
    names = {"balancer": ["172.18.0.5"], "mixed": ["127.0.0.1", "8.8.8.8"], "gone": []}

    def resolve(host: str) -> list[str]:
        return names[host]

    assert check_target("http://balancer:8100", ["172.18.0.0/16"], resolve) == ["172.18.0.5"]
    with pytest.raises(TargetRefused):
        check_target("http://balancer:8100", resolve=resolve)
    with pytest.raises(TargetRefused, match="8.8.8.8"):
        check_target("http://mixed:8100", resolve=resolve)
    with pytest.raises(TargetRefused, match="does not resolve"):
        check_target("http://gone:8100", resolve=resolve)
    assert check_target("http://localhost:8100")


def test_a_refused_target_exits_2_with_one_line(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    res = subprocess.run(
        [sys.executable, "-m", LOAD_PROGRAM, "--target", "http://192.0.2.1:80"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "CHAOSBENCH_EVENTS": str(events)},
    )
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "192.0.2.1" in res.stderr and not events.exists()


# ------------------------------------------------------------------------------------------------ the model file


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_model_file_is_written_atomically_and_loads(tmp_path: Path) -> None:
    model_file = tmp_path / "ckpt" / "model.pt"
    args = serve_replica.parse_args(
        ["--init-model", "--model-file", str(model_file), "--hidden", "8", "--layers", "1", "--seed", "3"]
    )
    ev = tmp_path / "events.jsonl"
    probe = Probe(str(ev), rank=0)
    assert serve_replica.write_model(args, probe) == 0
    assert [p.name for p in model_file.parent.iterdir()] == ["model.pt"]  # no temporary file left
    begin, end = _events(ev)
    assert (begin["kind"], end["kind"], end["complete"], end["path"]) == (
        "ckpt_save_begin",
        "ckpt_save_end",
        True,
        str(model_file),
    )

    load_args = serve_replica.parse_args(
        ["--model-file", str(model_file), "--hidden", "8", "--layers", "1", "--port", "1"]
    )
    replica = Probe(str(ev), rank=1)
    model, info = serve_replica.load_model(load_args, replica, Planted(replica, {}))
    assert info["bytes"] == model_file.stat().st_size and info["finite"]
    kinds = [e["kind"] for e in _events(ev)[2:]]
    assert kinds == ["model_load_begin", "model_load_end"]
    # the same seed gives the same model, whoever writes it
    again = tmp_path / "again.pt"
    serve_replica.write_model(
        serve_replica.parse_args(
            ["--init-model", "--model-file", str(again), "--hidden", "8", "--layers", "1", "--seed", "3"]
        ),
        Probe(None),
    )
    _, info2 = serve_replica.load_model(
        serve_replica.parse_args(
            ["--model-file", str(again), "--hidden", "8", "--layers", "1", "--port", "1"]
        ),
        Probe(None),
        Planted(Probe(None), {}),
    )
    assert info2["digest"] == info["digest"]


def test_crash_loop_fires_during_the_load_and_other_plants_are_skipped(tmp_path: Path) -> None:
    model_file = tmp_path / "model.pt"
    serve_replica.write_model(
        serve_replica.parse_args(["--init-model", "--model-file", str(model_file)]), Probe(None)
    )
    plants = [
        {"fault": "boom", "injector": "crash-loop", "ranks": "1", "at_step": 1},
        {"fault": "late", "injector": "segfault", "ranks": "all", "at_step": 5},
    ]
    env = {"CHAOSBENCH_PLANTED": json.dumps(plants), "CHAOSBENCH_RUN_DIR": str(tmp_path)}
    ev = tmp_path / "events.jsonl"
    probe = Probe(str(ev), rank=1)
    planted = Planted(probe, env)
    serve_replica.skip_unfireable(planted, probe)
    args = serve_replica.parse_args(["--model-file", str(model_file), "--port", "1"])
    for _ in range(2):  # every incarnation
        with pytest.raises(PlantedFault):
            serve_replica.load_model(args, probe, planted)
    kinds = [(e["kind"], e.get("fault")) for e in _events(ev)]
    assert kinds == [
        ("fault_skipped", "late"),
        ("model_load_begin", None),
        ("fault_inject", "boom"),
        ("model_load_begin", None),
        ("fault_inject", "boom"),
    ]
