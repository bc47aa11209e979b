"""Ranks chaosbench launches itself get torchrun's worker environment (``torchrun_worker_env``): the variables torch's
own agent sets for a worker, with the values torchrun would give that rank; and the probe counts a rank's
incarnation once, whoever set ``TORCHELASTIC_RESTART_COUNT``."""

from __future__ import annotations

import inspect
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from chaosbench.frameworks.base import JobContext, torchrun_worker_env
from chaosbench.frameworks.none import rank_processes
from chaosbench.frameworks.slurm_requeue import SlurmRequeueFramework
from chaosbench.launchers.command import rank_values
from chaosbench.probe import ENV_RESTART_COUNT_COUNTED, incarnation_from_env
from chaosbench.registry import RUNTIMES, WORKLOADS
from chaosbench.runner import Runner
from chaosbench.runtimes.base import RunInfo
from chaosbench.runtimes.slurm.runtime import UNRESOLVED_MASTER_ADDR
from chaosbench.timeline import TimelineWriter
from tests.conftest import make_suite


def torchrun_variables() -> set[str]:
    """What torch's LocalElasticAgent sets for every worker, read from its source (the truth, whatever the torch
    version): the keys of ``_start_workers``'s ``worker_env`` plus ``LOCAL_RANK`` (``_set_local_rank_env``)."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    names = set(re.findall(r'"([A-Z][A-Z_]+)": ', inspect.getsource(LocalElasticAgent._start_workers)))
    assert {"RANK", "TORCHELASTIC_RUN_ID"} <= names  # the source still reads as expected
    return names | {"LOCAL_RANK"}


def expected(
    rank: int, ranks: int, nodes: int, restarts: int, max_restarts: int, run_id: str, addr: str, port: str
) -> dict[str, str]:
    """What torchrun would give global rank ``rank`` of a ``ranks`` x ``nodes`` job (node-major), one role."""
    per_node = ranks // nodes
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank % per_node),
        "GROUP_RANK": str(rank // per_node),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "WORLD_SIZE": str(ranks),
        "ROLE_WORLD_SIZE": str(ranks),
        "LOCAL_WORLD_SIZE": str(per_node),
        "GROUP_WORLD_SIZE": str(nodes),
        "MASTER_ADDR": addr,
        "MASTER_PORT": port,
        "TORCHELASTIC_RESTART_COUNT": str(restarts),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }


SUITE = """
name: worker-env
seed: 1
defaults:
  runtime: {runtime}
  workload: {{name: ddp-mlp, ranks: 4, nodes: 2, steps: 5}}
frameworks:
  none: {{}}
  restart: {{max_restarts: 5}}
  torchrun: {{}}
  slurm-requeue: {{max_restarts: 2}}
matrix: {{frameworks: [{frameworks}], faults: [], repeats: 1}}
"""


def _plans(tmp_path: Path, runtime: str, frameworks: str) -> dict[str, list[dict[str, str]]]:
    suite = make_suite(SUITE.format(runtime=runtime, frameworks=frameworks))
    return {
        sc.framework_label: [p.env for p in plan.processes] for sc, plan in Runner(suite, tmp_path).plans()
    }


def _job(tmp_path: Path, runtime: str, run_id: str = "run-7") -> JobContext:
    """The job of the suite's first scenario, as the runner builds it."""
    sc = next(make_suite(SUITE.format(runtime=runtime, frameworks="none")).iter_scenarios())
    wl = WORKLOADS.get(sc.workload.name)
    rt = RUNTIMES.get(sc.runtime)
    return JobContext(
        scenario=sc,
        run_id=run_id,
        run_dir=tmp_path / "run",
        ckpt_dir=tmp_path / "run" / "ck",
        events_path=tmp_path / "run" / "events.jsonl",
        workload=wl(sc.workload, wl.Options.model_validate(sc.workload.options)),
        runtime=rt(RunInfo(run_id, tmp_path, TimelineWriter(tmp_path / "t.jsonl"))),
    )


def test_the_function_sets_what_torchs_agent_sets() -> None:
    env = torchrun_worker_env(
        rank=5,
        local_rank=1,
        group_rank=2,
        world_size=8,
        local_world_size=2,
        group_world_size=4,
        master_addr="h0",
        master_port=29500,
        run_id="r",
        restart_count=3,
        max_restarts=4,
        inherited={},
    )
    assert set(env) == torchrun_variables() | {ENV_RESTART_COUNT_COUNTED}
    assert env == {
        **expected(5, 8, 4, 3, 4, "r", "h0", "29500"),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        ENV_RESTART_COUNT_COUNTED: "3",
    }
    # the agent passes its own setting on; so does the harness
    inherited = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
    assert (
        torchrun_worker_env(
            rank=0,
            local_rank=0,
            group_rank=0,
            world_size=1,
            local_world_size=1,
            group_world_size=1,
            master_addr="h0",
            master_port=1,
            run_id="r",
            restart_count=0,
            max_restarts=0,
            inherited=inherited,
        )["TORCH_NCCL_ASYNC_ERROR_HANDLING"]
        == "3"
    )


@pytest.mark.parametrize("runtime", ["local", "docker", "slurm"])
def test_none_and_restart_plans_give_every_rank_torchruns_environment(tmp_path: Path, runtime: str) -> None:
    plans = _plans(tmp_path, runtime, "none, restart")
    for label, max_restarts in (("none", 0), ("restart", 5)):
        envs = plans[label]
        assert len(envs) == 4
        addr, port = envs[0]["MASTER_ADDR"], envs[0]["MASTER_PORT"]
        assert addr == {"local": "127.0.0.1", "docker": "node0", "slurm": UNRESOLVED_MASTER_ADDR}[runtime]
        for rank, env in enumerate(envs):
            assert torchrun_variables() <= set(env)
            assert {k: env[k] for k in torchrun_variables()} == expected(
                rank, 4, 2, 0, max_restarts, "dry-run", addr, port
            )
            assert env["CHAOSBENCH_NODE"] == f"node{rank // 2}"
            assert incarnation_from_env(env) == 0


def test_a_restarted_incarnation_carries_its_restart_count_and_counts_it_once(tmp_path: Path) -> None:
    job = _job(tmp_path, "local")
    procs = rank_processes(job, 2, 31000, max_restarts=5)
    for rank, p in enumerate(procs):
        assert p.incarnation == 2 and p.name == f"rank{rank}.i2"
        assert {k: p.env[k] for k in torchrun_variables()} == expected(
            rank, 4, 2, 2, 5, "run-7", "127.0.0.1", "31000"
        )
        assert p.env["CHAOSBENCH_INCARNATION"] == "2"
        # the probe and the command shim's {incarnation}: 2, not CHAOSBENCH_INCARNATION + TORCHELASTIC_RESTART_COUNT
        assert incarnation_from_env(p.env) == 2
        assert rank_values(p.env)["incarnation"] == "2"


def test_the_probe_still_adds_the_restart_count_of_a_real_agent() -> None:
    # torchrun (one agent): the harness's incarnation is 0, torchrun counts its own restarts
    torchrun_worker = {"CHAOSBENCH_INCARNATION": "0", "TORCHELASTIC_RESTART_COUNT": "1"}
    assert incarnation_from_env(torchrun_worker) == 1
    assert rank_values(torchrun_worker)["incarnation"] == "1"
    # chaosbench.launchers.elastic: CHAOSBENCH_INCARNATION = round - restart count, so the sum is the round
    assert incarnation_from_env({"CHAOSBENCH_INCARNATION": "2", "TORCHELASTIC_RESTART_COUNT": "1"}) == 3
    assert incarnation_from_env({"CHAOSBENCH_INCARNATION": "-1", "TORCHELASTIC_RESTART_COUNT": "1"}) == 0
    # no agent, no harness: 0
    assert incarnation_from_env({}) == 0
    # a torchrun the user's command starts inside a rank chaosbench launched: that torchrun's own count is added
    nested = {
        "CHAOSBENCH_INCARNATION": "0",
        ENV_RESTART_COUNT_COUNTED: "0",
        "TORCHELASTIC_RESTART_COUNT": "2",
    }
    assert incarnation_from_env(nested) == 2


def test_agents_get_no_worker_environment_of_the_harness(tmp_path: Path) -> None:
    """Under torchrun the agent sets its workers' variables; the harness's marker must not reach them, or the
    probe would stop adding torchrun's restart count."""
    for env in _plans(tmp_path, "local", "torchrun")["torchrun"]:
        assert ENV_RESTART_COUNT_COUNTED not in env
        assert not {"RANK", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID"} & set(env)


FAKE_SCONTROL = """#!/bin/sh
case "$*" in
  "show hostnames"*) echo c1; echo c2 ;;
  "show node -o c1") echo "NodeName=c1 Arch=x86_64 NodeAddr=10.1.2.3 NodeHostName=c1" ;;
esac
"""

# srun -N <nodes> --ntasks-per-node=<n> ... <task argv>: every task in turn, with srun's per-task variables; the
# rank's own command (after `bash -c TASK rank`) replaced by one that dumps its environment
FAKE_SRUN = f"""#!{sys.executable}
import json, os, subprocess, sys
args = sys.argv[1:]
nodes = int(args[args.index("-N") + 1])
per_node = int(next(a for a in args if a.startswith("--ntasks-per-node=")).split("=")[1])
i = args.index("bash")
task = args[i:i + 4]
dump = [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"]
out = []
for procid in range(nodes * per_node):
    env = dict(os.environ, SLURM_PROCID=str(procid), SLURM_LOCALID=str(procid % per_node),
               SLURM_NODEID=str(procid // per_node), SLURM_NTASKS=str(nodes * per_node))
    out.append(json.loads(subprocess.run(task + dump, env=env, capture_output=True, text=True, check=True).stdout))
with open(os.environ["FAKE_SRUN_OUT"], "w") as f:
    json.dump(out, f)
"""


def test_the_slurm_requeue_batch_script_gives_every_task_torchruns_environment(tmp_path: Path) -> None:
    """The batch script, run by bash with srun and scontrol faked: every task's environment as it would be on a
    cluster, after its second requeue (SLURM_RESTART_COUNT=2)."""
    job = _job(tmp_path, "slurm", run_id="run-9")
    fw = SlurmRequeueFramework(
        "slurm-requeue", SlurmRequeueFramework.Options.model_validate({"max_restarts": 2})
    )
    script = fw.script(job)
    srun_line = next(line for line in script.splitlines() if line.startswith("srun "))
    assert "bash -c" in srun_line and "exec" in shlex.split(srun_line)[shlex.split(srun_line).index("-c") + 1]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN)):
        (bin_dir / name).write_text(textwrap.dedent(text))
        (bin_dir / name).chmod(0o755)
    (tmp_path / "job.sh").write_text(script)
    out = tmp_path / "tasks.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHAOSBENCH_", "TORCHELASTIC_"))}
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}",
        SLURM_RESTART_COUNT="2",
        SLURM_JOB_NODELIST="c[1-2]",
        FAKE_SRUN_OUT=str(out),
    )
    res = subprocess.run(
        ["bash", str(tmp_path / "job.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stdout + res.stderr
    tasks = json.loads(out.read_text())
    assert len(tasks) == 4
    port = tasks[0]["MASTER_PORT"]
    assert port.isdigit()
    for rank, task in enumerate(tasks):
        assert {k: task[k] for k in torchrun_variables()} == expected(
            rank, 4, 2, 2, 2, "run-9", "10.1.2.3", port
        )
        assert task["CHAOSBENCH_NODE"] == f"node{rank // 2}"
        assert task["CHAOSBENCH_INCARNATION"] == "2"
        assert incarnation_from_env(task) == 2


def test_ft_launcher_sets_torchruns_worker_environment_itself() -> None:
    """nvrx: the bridge starts its rank with ft_launcher's worker environment (inherited, not rebuilt), and
    ft_launcher's agent sets every variable torch's does: nothing for chaosbench to add there."""
    launcher = pytest.importorskip("nvidia_resiliency_ext.fault_tolerance.launcher")
    source = inspect.getsource(launcher.LocalElasticAgent._start_workers)
    missing = {n for n in torchrun_variables() if f'"{n}"' not in source}
    assert missing == set()
    from chaosbench.launchers import nvrx

    bridge = inspect.getsource(nvrx.bridge)
    assert "subprocess.Popen(argv, preexec_fn=_die_with_parent)" in bridge  # no env=: the rank inherits it
