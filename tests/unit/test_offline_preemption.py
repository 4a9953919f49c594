"""``hami schedule`` shows the preemption it would make (victims, card, freed slice)
without making it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from hami.api import names
from hami.cli import app
from hami.offline import schedule

REGISTER = json.dumps([{"id": f"GPU-{i}", "index": i, "count": 10, "devmem": 15360,
                        "devcore": 100, "type": "NVIDIA-A10", "health": True}
                       for i in range(2)])


def objects(budget: bool = False) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"kind": "Node", "metadata": {
        "name": "gpu-0", "annotations": {names.NODE_REGISTER: REGISTER}}}]
    for i, (prio, app_label) in enumerate([(10, "batch"), (20, "train")]):
        out.append({"kind": "Pod", "metadata": {
            "name": f"lo-{i}", "namespace": "ml", "uid": f"u-lo-{i}", "labels": {"app": app_label},
            "annotations": {names.DEVICES_ALLOCATED: f"GPU-{i},NVIDIA,12000,0:;"}},
            "spec": {"nodeName": "gpu-0", "priority": prio, "schedulerName": "hami-scheduler",
                     "containers": [{"name": "c"}]},
            "status": {"phase": "Running"}})
    if budget:
        out.append({"kind": "PodDisruptionBudget", "metadata": {"name": "b", "namespace": "ml"},
                    "spec": {"selector": {"matchLabels": {"app": "batch"}}},
                    "status": {"disruptionsAllowed": 0}})
    out.append({"kind": "Pod", "metadata": {"name": "hi", "namespace": "ml"},
                "spec": {"priority": 1000, "containers": [{"name": "c", "resources": {
                    "limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 12000}}}]}})
    return out


def test_the_report_names_victims_card_and_freed_slice() -> None:
    report = schedule(objects())
    (pod,) = report["pods"]
    assert pod["node"] is None
    plan = pod["preemption"]
    assert plan["node"] == "gpu-0" and plan["cards"] == ["GPU-0"]
    assert [(v["name"], v["priority"]) for v in plan["victims"]] == [("lo-0", 10)]
    assert plan["freed_on_cards"] == {"GPU-0": {"memory_mib": 12000, "cores_percent": 0,
                                                "slots": 1}}
    # a budget on lo-0 moves the choice to lo-1's card
    plan = schedule(objects(budget=True))["pods"][0]["preemption"]
    assert plan["cards"] == ["GPU-1"] and plan["victims"][0]["name"] == "lo-1"
    assert plan["pdb_violations"] == 0


def test_no_preemption_shown_when_none_helps() -> None:
    objs = objects()
    objs[-1]["spec"]["priority"] = 5  # below every running pod
    assert schedule(objs)["pods"][0]["preemption"] is None
    objs[-1]["spec"]["priority"] = 1000
    objs[-1]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = 20000
    assert schedule(objs)["pods"][0]["preemption"] is None


def test_the_table_shows_it_as_a_dry_run(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all(objects()))
    result = CliRunner().invoke(app, ["schedule", "-f", str(path)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "would preempt on gpu-0 (card GPU-0): evict ml/lo-0 (priority 10)" in text
    assert "GPU-0 12000 MiB" in text and "not done: dry run" in text
