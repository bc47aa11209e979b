"""The elasticity comparison on hand-written result rows with known answers: the strategy table, the winner
sentence and its interval, expected divergence, the spare-pool projection and the break-even pool size."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from chaosbench.analysis.elasticity import by_workload, compare, project_strategies
from chaosbench.analysis.fleet import (
    LLAMA3,
    Assumptions,
    FleetScale,
    break_even_pool,
    spare_found,
    spare_pool_point,
)
from chaosbench.analysis.stats import median_difference_ci
from chaosbench.report.elasticity import elasticity_blocks, strategy_table, winner_sentences
from chaosbench.report.writer import write_report


def _row(
    fw: str, strategy: str, ttr: float | None, workload: str = "pp-lm", **kw: object
) -> dict[str, object]:
    row: dict[str, object] = {
        "suite": "elasticity",
        "scenario": f"{fw}/node-kill",
        "framework": fw,
        "strategy": strategy,
        "workload": workload,
        "fault": "node-kill",
        "control": False,
        "fault_class": "node",
        "outcome": "recovered" if ttr is not None else "not_recovered",
        "time_to_resume_s": ttr,
        "rollback": True,
        "world_size_before": 4,
        "world_size_after": 4,
        "global_batch_before": 32,
        "global_batch_after": 32,
        "stage_detect_s": 0.5,
        "stage_reschedule_s": 2.0,
        "stage_reshard_or_replace_s": 1.0,
        "stage_resume_s": 1.5,
        "goodput": 0.8,
        "lost_steps": 5,
        "lost_work_s": 1.0,
        "fidelity": "exact",
    }
    row.update(kw)
    return row


def _rows() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for fw, strategy in (
        ("inplace-pp", "restart-in-place"),
        ("spare-pp", "hot-spare"),
        ("shrink-pp", "shrink"),
    ):
        rows.append(
            {
                "framework": fw,
                "strategy": strategy,
                "workload": "pp-lm",
                "control": True,
                "outcome": "completed",
                "clean": True,
            }
        )
    for ttr, gp in ((20.0, 0.60), (22.0, 0.58), (21.0, 0.61), (25.0, 0.55)):
        rows.append(_row("inplace-pp", "restart-in-place", ttr, goodput=gp, stage_reschedule_runtime_s=10.0))
    for ttr, gp in ((5.0, 0.80), (5.5, 0.79), (6.0, 0.78), (5.2, 0.81)):
        rows.append(_row("spare-pp", "hot-spare", ttr, goodput=gp, stage_reschedule_runtime_s=0.5))
    for ttr in (8.0, 9.0, 8.5):
        rows.append(
            _row(
                "shrink-pp",
                "shrink",
                ttr,
                world_size_after=2,
                global_batch_after=16,
                fidelity="diverged",
                fidelity_reason="world size 4 -> 2: global batch 32 -> 16, expected to diverge",
            )
        )
    rows.append(
        _row(
            "ft",
            "continue",
            1.0,
            workload="ft-mlp",
            rollback=False,
            lost_work_s=0.2,
            stage_reschedule_s=0.0,
            stage_reshard_or_replace_s=0.0,
        )
    )
    rows.append(
        _row("shrink-pp", "shrink", None, outcome="fault_not_fired")
    )  # not counted: the fault did not fire
    return rows


def test_strategy_table_per_workload() -> None:
    groups = by_workload(_rows())
    assert list(groups) == ["ft-mlp", "pp-lm"]
    pp = groups["pp-lm"]
    assert [g.label for g in pp] == [
        "inplace-pp (restart-in-place)",
        "spare-pp (hot-spare)",
        "shrink-pp (shrink)",
    ]
    table = strategy_table(pp)
    by_label = {r[0]: r for r in table.rows}
    shrink = by_label["shrink-pp (shrink)"]
    assert shrink[1] == "3" and str(shrink[2]).startswith("3/3 (100%")
    assert str(shrink[3]).startswith("8.500 [")  # median time to resume with its interval
    assert shrink[-3:] == ["4 -> 2", "32 -> 16", "3 diverged (expected)"]
    spare = by_label["spare-pp (hot-spare)"]
    assert spare[5] == "2.000 (runtime 0.500)"  # reschedule stage with the runtime's share
    assert spare[-1] == "4 exact"


def test_winner_sentence_names_the_strategy_and_the_interval() -> None:
    pp = by_workload(_rows())["pp-lm"]
    c = compare(pp, "time_to_resume_s", lower_is_better=True)
    assert c is not None and c.best.framework == "spare-pp" and c.other.framework == "shrink-pp"
    assert c.difference.median == pytest.approx(8.5 - 5.35)
    assert c.separable and c.difference.lo is not None and c.difference.lo > 0
    text = " ".join(winner_sentences("pp-lm", pp))
    assert (
        "pp-lm: spare-pp (hot-spare) resumed fastest (median 5.350 s against 8.500 s for shrink-pp (shrink)), "
        "by 3.150 s (95 % CI of the difference" in text
    )
    # goodput: the shrunken runs' 80 % against the spare's 79.5 % is within the noise of four repeats
    assert (
        "Goodput over the run: shrink-pp (shrink) highest (median 80.0% against 79.5% for spare-pp (hot-spare)), "
        "by 0.5 points, not separable: the 95 % interval of the difference" in text
    )
    # overlapping samples: not separable, and said so
    close = [r for r in _rows() if r.get("framework") != "shrink-pp"]
    close += [_row("shrink-pp", "shrink", t) for t in (4.0, 7.0, 5.1, 6.5)]
    c = compare(by_workload(close)["pp-lm"], "time_to_resume_s", lower_is_better=True)
    assert c is not None and not c.separable and c.why == "the interval of the difference includes 0"
    assert "not separable: the 95 % interval of the difference" in " ".join(
        winner_sentences("pp-lm", by_workload(close)["pp-lm"])
    )
    # one run each: no interval
    few = [_row("a", "hot-spare", 1.0), _row("b", "shrink", 2.0)]
    assert (
        "not separable: too few runs for an interval (n=1)"
        in winner_sentences("pp-lm", by_workload(few)["pp-lm"])[0]
    )
    assert "no winner" in winner_sentences("ft-mlp", by_workload(_rows())["ft-mlp"])[0]


def test_median_difference_interval() -> None:
    d = median_difference_ci([10.0, 11.0, 12.0, 13.0], [5.0, 6.0, 7.0, 5.5])
    assert d.median == pytest.approx(11.5 - 5.75) and d.lo is not None and d.hi is not None
    assert d.median is not None and 0 < d.lo <= d.median <= d.hi
    assert median_difference_ci([1.0], [2.0, 3.0]).lo is None
    assert median_difference_ci([], [1.0]).median is None


def test_spare_pool_goodput_grows_and_stops_paying() -> None:
    a = Assumptions()
    repair_s, spare_s, none_s = 3600.0, 60.0, 3660.0
    points = [spare_pool_point(p, spare_s, none_s, LLAMA3, a, repair_s) for p in range(0, 40)]
    assert points[0].spare_found == 0.0 and points[0].recovery_s == none_s
    assert all(
        b.spare_found >= a_.spare_found and b.goodput >= a_.goodput
        for a_, b in zip(points, points[1:], strict=False)
    )
    assert points[-1].recovery_s == pytest.approx(spare_s)
    # the number of nodes in repair is Poisson(repair / job MTBF): one spare covers P(none in repair)
    mean = repair_s / LLAMA3.job_mtbf_s
    assert spare_found(1, mean) == pytest.approx(2.718281828**-mean)
    be = break_even_pool(spare_s, none_s, LLAMA3, a, repair_s)
    gain = [b.goodput - a_.goodput for a_, b in zip(points, points[1:], strict=False)]
    assert gain[be - 1] >= 1 / LLAMA3.nodes > gain[be]  # the last spare worth its idle GPUs, the next one not
    assert points[be].net_goodput == max(p.net_goodput for p in points)
    # a tiny fleet whose spares idle a large share: no spare is worth it when spares buy little
    assert break_even_pool(60.0, 61.0, FleetScale(4, 8, 1000.0), a, repair_s) == 0


def test_fleet_projection_per_strategy_from_measured_rows() -> None:
    pp = by_workload(_rows())["pp-lm"]
    a = Assumptions()
    fleet = project_strategies(pp, LLAMA3, a, repair_s=3600.0, pools=[0, 1, 2, 4])
    assert fleet.missing == ["continue"]
    by = {s.strategy: s for s in fleet.strategies}
    inplace = by["restart-in-place"]
    assert inplace.measured_s == pytest.approx(22.0) and inplace.per_loss_s == pytest.approx(
        3600 + 22.0 - 10.0
    )
    assert by["shrink"].per_loss_s == pytest.approx(2 * 8.5 + 3600 / LLAMA3.nodes)
    # pool 0 of the hot spare is restart in place
    assert fleet.pools[0].pool == 0 and fleet.pools[0].goodput == pytest.approx(inplace.goodput)
    assert fleet.break_even is not None and fleet.break_even >= 1
    assert [s.goodput for s in fleet.strategies] == sorted(
        (s.goodput for s in fleet.strategies), reverse=True
    )


def test_section_only_with_strategies_and_in_the_report(tmp_path: Path) -> None:
    assert elasticity_blocks([{k: v for k, v in r.items() if k != "strategy"} for r in _rows()], None) == []
    rows = _rows()
    for r in rows:
        r["missing"] = json.dumps({})
    write_report(
        tmp_path,
        pd.DataFrame(rows),
        definition={"projection": {"nodes": 2048, "node_mtbf_h": 5000, "node_repair_s": 1800}},
    )
    md = (tmp_path / "report.md").read_text()
    assert "## Elasticity: recovery strategies" in md and "### Workload: pp-lm" in md
    assert "node repair time 1800 s (projection.node_repair_s)" in md
    assert "A spare pool is worth it up to" in md
    assert "Strategies without runs on ft-mlp: restart-in-place, hot-spare, shrink." in md
    assert "diverged as expected" in md and "`fidelity == exact` still fails" in md


def test_harness_cpu_sentence_from_measured_rows_only() -> None:
    from chaosbench.report.elasticity import harness_cpu_sentence

    rows = [{"harness_cpu_share": 0.02}, {"harness_cpu_share": 0.04}, {"harness_cpu_share": None}, {}]
    text = harness_cpu_sentence(rows)
    assert "3.0%" in text and "over 2 runs" in text and "at most 4.0%" in text
    assert "not measured" in harness_cpu_sentence([{}])
