"""Suite parsing and its one-line errors."""

from __future__ import annotations

import pytest

from chaosbench.errors import SpecError
from chaosbench.specs import fault_definitions, fault_library, load_suite
from tests.conftest import ROOT, make_suite

GOOD = """\
name: t
seed: 3
defaults:
  workload: {name: ddp-mlp, ranks: 2, steps: 30}
frameworks:
  restart: {max_restarts: 2}
  tr-default: {adapter: torchrun}
faults:
  kill-rank1: {injector: kill, target: {rank: 1}, trigger: {at_step: 5}}
  hang-any: {injector: hang, target: random, trigger: {after_s: 1.5}, params: {duration_s: 2}}
matrix:
  frameworks: [restart, tr-default, none]
  faults: [kill-rank1, hang-any]
  repeats: 2
"""


def test_good_suite_expands_to_controls_and_matrix() -> None:
    suite = make_suite(GOOD)
    scenarios = suite.scenarios()
    assert len(scenarios) == 3 * (1 + 2 * 2)
    assert scenarios[0].id == "restart/control" and scenarios[0].control
    tr = [s for s in scenarios if s.framework_label == "tr-default"]
    assert {s.adapter for s in tr} == {"torchrun"}
    hang = [s for s in scenarios if s.fault_name == "hang-any"]
    assert hang[0].fault is not None and hang[0].fault.target.rank == "random"
    assert hang[0].fault.trigger.after_s == 1.5
    # per-run seeds are stable and distinct
    assert len({s.rng_seed for s in scenarios}) == len(scenarios)
    assert make_suite(GOOD).scenarios()[3].rng_seed == scenarios[3].rng_seed


def test_matrix_include_adds_runs_of_some_frameworks_only() -> None:
    text = GOOD.replace(
        "  repeats: 2\n",
        "  repeats: 2\n  include:\n    - {frameworks: [restart, ft], faults: [[kill-rank1, "
        "hang-any]], repeats: 1}\n",
    ).replace(
        "  tr-default: {adapter: torchrun}", "  tr-default: {adapter: torchrun}\n  ft: {adapter: restart}"
    )
    ids = [(s.id, s.repeat) for s in make_suite(text).scenarios()]
    restart = [i for i in ids if i[0].startswith("restart/")]
    assert restart[-1] == ("restart/kill-rank1+hang-any", 0) and len(restart) == 1 + 2 * 2 + 1
    assert [i for i in ids if i[0].startswith("ft/")] == [("ft/control", 0), ("ft/kill-rank1+hang-any", 0)]
    assert ids.index(("ft/control", 0)) > ids.index(
        ("none/control", 0)
    )  # after the cross product's frameworks
    msg = _error(text.replace("[[kill-rank1, hang-any]]", "[[kill-rank1, nope]]"))
    assert msg.startswith("suites/x.yaml:") and "matrix: unknown fault 'nope'" in msg, msg


def test_shipped_smoke_suite_is_valid() -> None:
    suite = load_suite(ROOT / "suites" / "smoke.yaml")
    assert set(suite.matrix.frameworks) == {"none", "restart", "torchrun"}
    assert len(suite.scenarios()) == 3 + 3 * 2 * 2


def _error(text: str) -> str:
    with pytest.raises(SpecError) as ei:
        make_suite(text, "suites/x.yaml")
    msg = str(ei.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "injector: kill,",
            "injector: kil,",
            "suites/x.yaml:9: fault 'kill-rank1': unknown injector 'kil' (known: ",
        ),
        (
            "at_step: 5}",
            "at_step: 5, after_s: 2}",
            "suites/x.yaml:9: fault 'kill-rank1': trigger: give exactly one",
        ),
        (
            "at_step: 5}",
            "at_step: -1}",
            "suites/x.yaml:9: fault 'kill-rank1': trigger.at_step: Input should be",
        ),
        (
            "duration_s: 2}",
            "duration_s: soon}",
            "suites/x.yaml:10: fault 'hang-any': duration_s: Input should be",
        ),
        ("duration_s: 2}", "duration: 2}", "suites/x.yaml:10: fault 'hang-any': duration: unknown option"),
        (
            "faults: [kill-rank1, hang-any]",
            "faults: [kill-rank1, hang-all]",
            "suites/x.yaml:13: matrix: unknown fault 'hang-all' (known: hang-any, kill-rank1)",
        ),
        (
            "restart: {max_restarts: 2}",
            "restart: {max_restart: 2}",
            "suites/x.yaml:6: framework 'restart': max_restart: unknown option",
        ),
        (
            "tr-default: {adapter: torchrun}",
            "tr-default: {adapter: torchrn}",
            "suites/x.yaml:7: framework 'tr-default': unknown framework 'torchrn' (known: ",
        ),
        (
            "target: {rank: 1}",
            "target: {rank: 5}",
            "suites/x.yaml:9: fault 'kill-rank1': target rank 5 does not exist (the workload has 2 ranks)",
        ),
        ("steps: 30}", "steps: 30, stepz: 3}", "suites/x.yaml:4: workload 'ddp-mlp': stepz: unknown option"),
        ("seed: 3", "sed: 3", "suites/x.yaml:2: sed: unknown key"),
        (
            "repeats: 2",
            "repeats: 0",
            "suites/x.yaml:14: matrix: repeats: Input should be greater than or equal",
        ),
        ("name: ddp-mlp", "name: ddp-mpl", "suites/x.yaml:4: workload: unknown workload 'ddp-mpl'"),
        ("signal: x", "", ""),
    ],
)
def test_errors_name_file_line_and_object(old: str, new: str, expected: str) -> None:
    if not expected:
        text = GOOD.replace("injector: kill,", "injector: kill, params: {signal: SIGBOGUS},")
        assert "unknown signal 'SIGBOGUS'" in _error(text)
        assert _error(text).startswith("suites/x.yaml:9: fault 'kill-rank1': signal:")
        return
    assert old in GOOD
    assert _error(GOOD.replace(old, new)).startswith(expected)


def test_yaml_syntax_error_has_line() -> None:
    msg = _error("name: t\nmatrix: {frameworks: [none]\n")
    assert msg.startswith("suites/x.yaml:3: invalid YAML")


def test_missing_required_and_not_a_mapping() -> None:
    assert _error("name: t\n").startswith("suites/x.yaml:1: matrix: required key is missing")
    assert _error("- a\n- b\n").startswith("suites/x.yaml:1: a suite must be a YAML mapping")


def test_missing_file() -> None:
    with pytest.raises(SpecError, match=r"^nope\.yaml: cannot read suite"):
        load_suite("nope.yaml")


def test_fault_definitions_from_faults_folder(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # ./faults is searched too: keep the repository's own out of this test
    (tmp_path / "suites").mkdir()
    (tmp_path / "faults").mkdir()
    (tmp_path / "faults" / "stop.yaml").write_text(
        "injector: hang\ntarget: {rank: 0}\ntrigger: {at_step: 3}\nparams: {duration_s: 4}\n"
    )
    suite_file = tmp_path / "suites" / "s.yaml"
    suite_file.write_text(
        "name: s\nfaults:\n  h: {use: stop, params: {duration_s: 9}}\n  k: {use: kill-rnk}\n"
        "matrix: {frameworks: [none], faults: [h]}\n"
    )
    msg = ""
    try:
        load_suite(suite_file)
    except SpecError as exc:
        msg = str(exc)
    known = ", ".join(sorted({*fault_library(), "stop"}))  # the suite's own, then the shipped library
    assert msg == f"{suite_file}:4: fault 'k': no fault definition 'kill-rnk' (known: {known})"
    suite_file.write_text(suite_file.read_text().replace("  k: {use: kill-rnk}\n", ""))
    fault = load_suite(suite_file).faults["h"]
    assert fault.injector == "hang" and fault.target.rank == 0 and fault.trigger.at_step == 3
    assert fault.params == {"duration_s": 9}  # overridden beside `use`
    (tmp_path / "faults" / "stop.yaml").write_text("injector: hang\ntrigger: {at_stp: 3}\n")
    with pytest.raises(SpecError, match=r"stop\.yaml:2: fault definition 'stop': trigger\.at_stp"):
        load_suite(suite_file)


SHIPPED_USE = (
    "name: u\nfaults:\n  k: {use: kill-rank, target: {rank: 1}}\nmatrix: {frameworks: [none], faults: [k]}\n"
)


def test_the_fault_library_ships_in_the_package_and_is_the_repositorys_faults_folder() -> None:
    lib = fault_library()
    assert sorted(lib) == sorted(p.stem for p in (ROOT / "faults").glob("*.yaml"))
    assert all(lib[n].read_bytes() == (ROOT / "faults" / f"{n}.yaml").read_bytes() for n in lib)


def test_use_finds_the_shipped_library_wherever_the_suite_lives(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # neither the suite's folders nor ./faults have a faults/ folder
    suite_file = tmp_path / "chaos" / "ci.yaml"
    suite_file.parent.mkdir()
    suite_file.write_text(SHIPPED_USE)
    fault = load_suite(suite_file).faults["k"]
    assert (fault.injector, fault.params, fault.target.rank, fault.trigger.at_step) == (
        "kill",
        {"signal": "SIGKILL"},
        1,
        25,
    )
    d = fault_definitions(str(suite_file))["kill-rank"]
    assert d.builtin and d.file == fault_library()["kill-rank"] and d.shadows is None


def test_a_suites_own_definition_wins_over_the_shipped_one(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    suite_file = tmp_path / "chaos" / "ci.yaml"
    (tmp_path / "chaos" / "faults").mkdir(parents=True)
    own = tmp_path / "chaos" / "faults" / "kill-rank.yaml"
    own.write_text("injector: kill\ntrigger: {at_step: 7}\nparams: {signal: SIGTERM}\n")
    suite_file.write_text(SHIPPED_USE)
    fault = load_suite(suite_file).faults["k"]
    assert (fault.params, fault.trigger.at_step) == ({"signal": "SIGTERM"}, 7)
    d = fault_definitions(str(suite_file))["kill-rank"]
    assert (d.file, d.builtin, d.shadows) == (own, False, fault_library()["kill-rank"])


def test_the_repositorys_suites_resolve_use_from_its_own_faults_folder() -> None:
    d = fault_definitions(str(ROOT / "suites" / "ci.yaml"))
    assert d["kill-rank"].file == ROOT / "faults" / "kill-rank.yaml"
    assert d["kill-rank"].builtin and d["kill-rank"].shadows is None  # the same file as the shipped one


def test_a_use_name_too_long_for_a_file_is_a_clean_error() -> None:
    name = "k" * 5000
    with pytest.raises(SpecError) as exc:
        make_suite(
            f"name: u\nfaults:\n  k:\n    use: {name}\nmatrix: {{frameworks: [none], faults: [k]}}\n",
            "s.yaml",
        )
    assert (
        str(exc.value)
        == "s.yaml:4: fault 'k': use: a fault definition's name has at most 200 characters (this one 5000)"
    )


def test_shipped_fault_definitions_are_valid() -> None:
    for path in sorted((ROOT / "faults").glob("*.yaml")):
        suite = make_suite(
            f"name: f\nfaults: {{x: {{use: {path.stem}, target: {{rank: 1}}}}}}\n"
            "matrix: {frameworks: [none], faults: [x]}\n",
            str(ROOT / "suites" / "probe.yaml"),
        )
        assert suite.faults["x"].injector


def test_framework_workload_override() -> None:
    suite = make_suite(
        "name: t\n"
        "defaults: {workload: {name: ddp-mlp, ranks: 2, nodes: 2, steps: 30, load_fallback: true}}\n"
        "frameworks:\n  restart: {workload: {steps: 40}}\n  torchft: {workload: {name: ft-mlp, steps: 20}}\n"
        "matrix: {frameworks: [restart, torchft, none]}\n"
    )
    by_fw = {sc.framework_label: sc.workload for sc in suite.scenarios()}
    assert by_fw["restart"].options == {"steps": 40, "load_fallback": True}  # same name: merged
    assert by_fw["torchft"].name == "ft-mlp" and by_fw["torchft"].options == {
        "steps": 20
    }  # other name: own options
    assert (by_fw["torchft"].ranks, by_fw["torchft"].nodes) == (2, 2)
    assert by_fw["none"].options == {"steps": 30, "load_fallback": True}
    msg = _error(
        "name: t\nframeworks: {torchft: {workload: {name: ft-mlp, stepz: 3}}}\nmatrix: {frameworks: [torchft]}\n"
    )
    assert msg == "suites/x.yaml:2: framework 'torchft' workload 'ft-mlp': stepz: unknown option"


def test_shipped_suites_are_valid() -> None:
    for path in sorted((ROOT / "suites").glob("*.yaml")):
        assert load_suite(path).scenarios(), path


@pytest.mark.parametrize("injector", ["net-delay", "net-loss"])
def test_netem_for_ingress_is_refused_at_load(injector: str) -> None:
    """netem shapes a node's egress only: asking for it on ingress is an error naming the fault, not a silent
    switch to the other method at injection."""
    amount = "delay_ms: 5" if injector == "net-delay" else "percent: 5"
    fault = (
        f"  slow-net: {{injector: {injector}, target: {{node: node1}}, trigger: {{at_step: 5}}, "
        f"params: {{{amount}, direction: ingress, method: netem}}}}\n"
    )
    text = GOOD.replace("\nfaults:\n", "\nfaults:\n" + fault).replace(
        "faults: [kill-rank1, hang-any]", "faults: [slow-net]"
    )
    text = text.replace("ranks: 2, steps: 30}", "ranks: 2, nodes: 2, steps: 30}")
    msg = _error(text)
    assert msg.startswith("suites/x.yaml:9: fault 'slow-net':"), msg
    assert "netem shapes egress only" in msg
    assert "netem shapes egress only" not in _error(text.replace("direction: ingress, ", "") + "bogus: 1\n")


@pytest.mark.parametrize("injector", ["node-pause", "node-cpu", "net-delay", "partition"])
def test_a_node_fault_on_a_runtime_without_node_control_fails_at_load(injector: str) -> None:
    """Docker-only faults on the local runtime: one line naming the fault, before anything runs."""
    params = {"node-cpu": "cpus: 0.5", "net-delay": "delay_ms: 5", "partition": "groups: [[node0], [node1]]"}
    target = "" if injector == "partition" else "target: {node: node1}, "
    fault = (
        f"  n: {{injector: {injector}, {target}trigger: {{at_step: 5}}"
        + (f", params: {{{params[injector]}}}" if injector in params else "")
        + "}\n"
    )
    text = GOOD.replace("\nfaults:\n", "\nfaults:\n" + fault).replace(
        "faults: [kill-rank1, hang-any]", "faults: [n]"
    )
    text = text.replace("ranks: 2, steps: 30}", "ranks: 2, nodes: 2, steps: 30}")
    msg = _error(text)
    assert msg.startswith("suites/x.yaml:9: fault 'n':"), msg
    assert f"{injector} needs a runtime whose nodes are containers (docker), not 'local'" in msg


def test_framework_runtime_options_and_strategy() -> None:
    """A framework entry can carry its own runtime options (merged over the defaults) and the recovery strategy
    it stands for; both reach the run's config."""
    suite = make_suite(
        "name: t\n"
        "defaults: {runtime: docker, runtime_options: {cpus_per_node: 1.0}, workload: {ranks: 2, nodes: 2}}\n"
        "frameworks:\n"
        "  spare: {adapter: restart, strategy: hot-spare, runtime_options: {spare_nodes: 1, lost_node: spare}}\n"
        "  restart: {strategy: restart-in-place}\n"
        "matrix: {frameworks: [spare, restart]}\n"
    )
    by_fw = {sc.framework_label: sc for sc in suite.scenarios()}
    assert by_fw["spare"].runtime_options == {"cpus_per_node": 1.0, "spare_nodes": 1, "lost_node": "spare"}
    assert by_fw["restart"].runtime_options == {"cpus_per_node": 1.0}
    assert (
        by_fw["spare"].to_dict()["strategy"] == "hot-spare"
        and by_fw["restart"].strategy == "restart-in-place"
    )
    bad = (
        "name: t\ndefaults: {runtime: docker}\nframeworks:\n  restart: {runtime_options: {spare_nodez: 1}}\n"
    )
    assert "framework 'restart'" in _error(bad + "matrix: {frameworks: [restart]}\n")
    assert "strategy" in _error(
        "name: t\nframeworks:\n  restart: {strategy: pray}\nmatrix: {frameworks: [restart]}\n"
    )


TYPED = """\
name: t
defaults:
  deadline_s: 60
  workload: {name: ddp-mlp, ranks: 2, steps: 30, pg_timeout_s: 10}
frameworks:
  restart: {max_restarts: 2}
faults:
  k: {injector: kill, target: 1, trigger: {at_step: 5}}
slos: {detected: true}
matrix: {frameworks: [restart], faults: [k], repeats: 1}
"""
_NOT_A_DIR = "is not usable as a directory name (give letters, digits, '.', '_', '-', starting with a letter or digit, at most 100 characters)"


@pytest.mark.parametrize(
    ("given", "wrong", "error"),
    [
        (
            "steps: 30",
            "steps: true",
            "s.yaml:4: workload 'ddp-mlp': steps: Input should be a valid integer (got True)",
        ),
        (
            "max_restarts: 2",
            "max_restarts: 1.0e+12",
            "s.yaml:6: framework 'restart': max_restarts: Input should be a valid integer (got 1000000000000.0)",
        ),
        (
            "at_step: 5",
            "at_step: 5.0",
            "s.yaml:8: fault 'k': trigger.at_step: Input should be a valid integer (got 5.0)",
        ),
        (
            "repeats: 1",
            "repeats: true",
            "s.yaml:10: matrix: repeats: Input should be a valid integer (got True)",
        ),
        (
            "ranks: 2",
            "ranks: 2.0",
            "s.yaml:4: defaults: workload.ranks: Input should be a valid integer (got 2.0)",
        ),
        (
            "pg_timeout_s: 10",
            "pg_timeout_s: true",
            "s.yaml:4: workload 'ddp-mlp': pg_timeout_s: Input should be a valid number (got True)",
        ),
        (
            "deadline_s: 60",
            "deadline_s: true",
            "s.yaml:3: defaults: deadline_s: Input should be a valid number (got True)",
        ),
        ("name: t\n", "name: t\ncontrol: 1\n", "s.yaml:2: control: Input should be a valid boolean (got 1)"),
        (
            "detected: true",
            "detected: ''",
            "s.yaml:9: slos: detected is true or false: give true or false (got '')",
        ),
        (
            "detected: true",
            "detected: 1",
            "s.yaml:9: slos: detected is true or false: give true or false (got 1.0)",
        ),
        (
            "{detected: true}",
            "{time_to_resume_s: true}",
            "s.yaml:9: slos: time_to_resume_s is a number: give a number or a bound such as {max: 30} (got True)",
        ),
        (
            "{detected: true}",
            "{outcome: ''}",
            "s.yaml:9: slos: outcome is a text: give a non-empty value such as recovered (got '')",
        ),
        (
            "  k: {injector: kill, target: 1, trigger: {at_step: 5}}\n",
            "  k: {injector: kill, target: 1, trigger: {at_step: 5}, slos: {fidelity: ''}}\n",
            "s.yaml:8: fault 'k': slos: fidelity is a text: give a non-empty value such as exact (got '')",
        ),
        ("name: t", "name: ''", f"s.yaml:1: name: '' {_NOT_A_DIR}"),
        ("name: t", "name: ../up", f"s.yaml:1: name: '../up' {_NOT_A_DIR}"),
        ("name: t", "name: a b", f"s.yaml:1: name: 'a b' {_NOT_A_DIR}"),
        ("  k: {inj", "  '': {inj", "s.yaml:7: faults: '' is not a name (give a non-empty name)"),
    ],
)
def test_types_mean_what_they_say(given: str, wrong: str, error: str) -> None:
    """A boolean is not a number, a float not an integer, an empty text not a name or a boolean."""
    assert make_suite(TYPED, "s.yaml").name == "t"  # an integer is a fine float (deadline_s: 60)
    assert given in TYPED
    with pytest.raises(SpecError) as exc:
        make_suite(TYPED.replace(given, wrong), "s.yaml")
    assert str(exc.value) == error


@pytest.mark.parametrize(
    ("given", "wrong", "error"),
    [
        (
            "at_step: 5",
            "at_step: 1000000000000000000",
            "s.yaml:8: fault 'k': at_step 1000000000000000000: the "
            "workload runs 30 steps; this fault can never fire (framework 'restart')",
        ),
        (
            "at_step: 5",
            "at_step: 31",
            "s.yaml:8: fault 'k': at_step 31: the workload runs 30 steps; this fault can never fire (framework 'restart')",
        ),
        (
            "trigger: {at_step: 5}",
            "trigger: {every_steps: 40}",
            "s.yaml:8: fault 'k': every_steps 40: the workload "
            "runs 30 steps; this fault can never fire (framework 'restart')",
        ),
        (
            "trigger: {at_step: 5}",
            "trigger: {on_event: {kind: ckpt_save_begin, step: 31}}",
            "s.yaml:8: fault 'k': "
            "on_event.step 31: the workload runs 30 steps; this fault can never fire (framework 'restart')",
        ),
        (
            "trigger: {at_step: 5}",
            "trigger: {after_s: 60}",
            "s.yaml:8: fault 'k': after_s 60: the run's deadline is "
            "60 s; this fault can never fire (framework 'restart')",
        ),
        (
            "trigger: {at_step: 5}",
            "trigger: {at_step: 5, delay_s: 100}",
            "s.yaml:8: fault 'k': delay_s 100: the "
            "run's deadline is 60 s; this fault can never fire (framework 'restart')",
        ),
        (
            "{injector: kill, target: 1, trigger: {at_step: 5}}",
            "{injector: abort, target: 1, params: {at_step: 99}}",
            "s.yaml:8: fault 'k': at_step 99: the workload runs 30 steps; this fault can never fire (framework 'restart')",
        ),
        (
            "{detected: true}",
            "{time_to_resume_s: -1}",
            "s.yaml:9: slos: time_to_resume_s -1.0: time_to_resume_s is never negative; no run can meet it",
        ),
        (
            "{detected: true}",
            "{time_to_resume_s: {max: -1}}",
            "s.yaml:9: slos: time_to_resume_s {'max': -1.0}: time_to_resume_s is never negative; no run can meet it",
        ),
        (
            "{detected: true}",
            "{lost_steps: {min: 5, max: 3}}",
            "s.yaml:9: slos: lost_steps {'max': 3.0, 'min': 5.0}: min is above max; no run can meet it",
        ),
        (
            "{detected: true}",
            "{goodput: {min: 1.5}}",
            "s.yaml:9: slos: goodput {'min': 1.5}: goodput is a share, at most 1; no run can meet it",
        ),
    ],
)
def test_what_can_never_happen_is_refused_with_its_line(given: str, wrong: str, error: str) -> None:
    assert given in TYPED
    with pytest.raises(SpecError) as exc:
        make_suite(TYPED.replace(given, wrong), "s.yaml")
    assert str(exc.value) == error


def test_what_can_happen_is_accepted() -> None:
    for given, edge in [
        ("at_step: 5", "at_step: 30"),
        ("{detected: true}", "{extra_wall_s: {max: -1}}"),
        ("{detected: true}", "{time_to_resume_s: {min: 0, max: 0}}"),
        ("trigger: {at_step: 5}", "trigger: {after_s: 59}"),
    ]:
        assert make_suite(TYPED.replace(given, edge), "s.yaml").name == "t"
