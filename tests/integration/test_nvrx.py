"""nvidia-resiliency-ext ``ft_launcher`` under the ``nvrx`` adapter (CPU, gloo): a hung rank is found by its
rank monitor's section timeout, not by the process-group timeout.

Skipped when nvidia_resiliency_ext is not importable, unless CHAOSBENCH_REQUIRE contains "nvrx" (then failed).
"""

from __future__ import annotations

import os

import pytest

from chaosbench.registry import FRAMEWORKS

pytestmark = pytest.mark.integration

SECTION_TIMEOUT_S = 3.0


@pytest.fixture(autouse=True)
def _need_nvrx() -> None:
    try:
        import nvidia_resiliency_ext.fault_tolerance  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available here"
        if "nvrx" in os.environ.get("CHAOSBENCH_REQUIRE", ""):
            pytest.fail(f"nvidia-resiliency-ext required (CHAOSBENCH_REQUIRE) but not importable: {exc}")
        pytest.skip(f"nvidia-resiliency-ext not importable ({exc})")
    if "nvrx" not in FRAMEWORKS.names():
        FRAMEWORKS.register("nvrx", "chaosbench.frameworks.nvrx:NvrxFramework")


def test_hung_rank_found_by_section_timeout(run_suite) -> None:
    res = run_suite(f"""
    name: nv
    seed: 11
    control: false
    defaults:
      deadline_s: 120
      workload: {{name: ddp-mlp, ranks: 2, steps: 40, checkpoint_every: 10, step_sleep_s: 0.05, pg_timeout_s: 60}}
    frameworks:
      nvrx: {{section_timeouts: {{step: {SECTION_TIMEOUT_S}, checkpoint: 30}}, rank_heartbeat_timeout_s: 10,
              share_rdzv_tcp_store: false}}
    faults:
      hang: {{injector: hang, target: {{rank: 1}}, trigger: {{at_step: 15}}}}
    matrix: {{frameworks: [nvrx], faults: [hang], repeats: 1}}
    """)
    m = res["nvrx/hang#0"]
    assert m.versions["nvidia-resiliency-ext"] and m.timeouts["section_timeout_step_s"] == SECTION_TIMEOUT_S
    assert m.detected, m.missing
    # the open 'step' section times out (the rank monitor checks every workload_check_interval_s = 1 s), far
    # ahead of the 60 s process-group timeout; the monitor kills the stopped rank (SIGCONT + SIGKILL)
    assert SECTION_TIMEOUT_S - 0.5 < m.time_to_detect_s < SECTION_TIMEOUT_S + 2.0, m.time_to_detect_s
    assert m.outcome == "recovered" and m.restart_count == 1 and m.final_step == 40
    assert m.lost_steps is not None and m.lost_steps <= 10
