"""The README's promises that a test can hold: its two set-up commands as CI and graders run them, its suite the
same runs as suites/smoke.yaml, its links pointing at pages that exist."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from chaosbench.specs import load_suite

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _without_descriptions(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _without_descriptions(v) for k, v in data.items() if k != "description"}
    if isinstance(data, list):
        return [_without_descriptions(v) for v in data]
    return data


def test_the_two_set_up_commands_are_there_verbatim() -> None:
    lines = README.read_text().splitlines()
    assert any(line.startswith("python3 -m pip install tox && tox -e smoke ") for line in lines)
    assert any(re.match(r"python3 -m pip install tox && tox( |$)", line) for line in lines)


def test_the_readme_suite_loads_to_the_smoke_suites_runs(tmp_path: Path) -> None:
    block = re.search(r"```yaml\n(.*?)```", README.read_text(), re.S)
    assert block, "README.md has no yaml block"
    shown = tmp_path / "smoke.yaml"
    shown.write_text(block.group(1))
    got = _without_descriptions(load_suite(shown).model_dump())
    want = _without_descriptions(load_suite(ROOT / "suites" / "smoke.yaml").model_dump())
    assert got == want


def test_readme_links_name_files_that_exist() -> None:
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    local = [t for t in targets if "://" not in t and not t.startswith(("none__", "restart__", "torchrun__"))]
    assert local
    assert [t for t in local if not (ROOT / t).exists()] == []
