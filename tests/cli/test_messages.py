"""Messages in the user's terms on ``hami schedule`` and ``hami simulate`` (issue 14 §4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from hami.cli import app

REGISTER = json.dumps([{"id": "GPU-a0", "index": 0, "count": 10, "devmem": 16384,
                        "devcore": 100, "type": "NVIDIA-Tesla T4", "health": True}])


def node(name: str, register: str = REGISTER) -> dict:
    return {"kind": "Node", "metadata": {"name": name, "annotations": {
        "hami.io/node-nvidia-register": register}}}


def pod(name: str, mem: int) -> dict:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "team"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {
                "nvidia.com/gpu": 1, "nvidia.com/gpumem": mem}}}]}}


def run_schedule(tmp_path: Path, objects: list[dict], *args: str) -> object:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    return CliRunner().invoke(app, ["schedule", "-f", str(path), *args],
                              env={"COLUMNS": "250"})


def test_table_says_unschedulable_and_shows_the_patch(tmp_path: Path) -> None:
    result = run_schedule(tmp_path, [node("n1"), pod("fits", 1000), pod("huge", 99999)])
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines()
            if line.startswith("│ team/")}
    assert "│ unschedulable" in rows["team/huge"] and "CardInsufficientMemory" in rows["team/huge"]
    assert "│ n1" in rows["team/fits"]
    assert "add /spec/schedulerName=hami-scheduler" in result.stdout


def test_quota_denial_names_the_quota_its_limit_and_use(tmp_path: Path) -> None:
    quota = {"kind": "ResourceQuota", "metadata": {"name": "gpu-quota", "namespace": "team"},
             "spec": {"hard": {"limits.nvidia.com/gpumem": "3000"}}}
    result = run_schedule(tmp_path, [node("n1"), quota, pod("first", 2000), pod("second", 2000)],
                          "-o", "json")
    denied = json.loads(result.stdout)["pods"][1]["admission"]
    assert not denied["allowed"]
    assert "ResourceQuota team/gpu-quota" in denied["message"]
    assert "limits.nvidia.com/gpumem 3000 MiB (2000 MiB in use)" in denied["message"]
    assert "asks for 2000 MiB" in denied["message"]


def test_a_file_without_pods_says_so(tmp_path: Path) -> None:
    result = run_schedule(tmp_path, [node("n1")])
    assert result.exit_code == 0
    assert "no pending pods to schedule" in result.stderr and "Node" in result.stderr
    assert "holds 1 object: Node" in result.stderr
    assert "dry run" not in result.stdout  # no empty table before the message


def test_bad_node_annotation_is_explained(tmp_path: Path) -> None:
    result = run_schedule(tmp_path, [node("a", "{not json"), node("b", "hello"),
                                     node("c", '[{"id": 5}]'), pod("p", 10)])
    out = " ".join(result.stdout.split())
    assert "node a not registered: the device register annotation is not valid JSON" in out
    assert ("node b not registered: the device register annotation is neither a JSON list "
            "of devices nor HAMi's older") in out
    assert "field 'id' must be of type string, got number 5" in out


def test_bad_seeds_are_explained() -> None:
    for seeds, words in (("abc", "'abc' is not a seed; give whole numbers such as 42"),
                         ("5-3", "the range '5-3' runs backwards"),
                         (",", "no seed given")):
        result = CliRunner().invoke(app, ["simulate", "--seeds", seeds, "--no-progress"],
                                    env={"COLUMNS": "250"})
        assert result.exit_code == 2
        assert words in result.output, result.output
        assert "invalid literal" not in result.output


def test_python_m_scheduler_command_is_hami_scheduler(tmp_path: Path) -> None:
    """The quickstart and the e2e harness start ``python -m hami.scheduler.command``: it
    logs as ``hami scheduler`` does (one key=value line per record, INFO included) and
    a missing kubeconfig is one line, not a traceback."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "hami.scheduler.command",
         f"--kubeconfig={tmp_path / 'missing'}", "--http_bind=127.0.0.1:0"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "error: no Kubernetes configuration" in done.stderr
    assert "level=warning logger=hami.scheduler" in done.stderr


def test_unreadable_cluster_file_is_one_line(tmp_path: Path) -> None:
    """A missing file, a folder or a binary file given to ``-f`` is one line naming it
    (a binary file was a UnicodeDecodeError traceback)."""
    binary = tmp_path / "blob"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00\xd0\xff\xfe")
    for path, words in ((tmp_path / "nope.yaml", "No such file or directory"),
                        (tmp_path, "Is a directory"),
                        (binary, "not UTF-8 text (byte 8); give a YAML or JSON file")):
        result = CliRunner().invoke(app, ["schedule", "-f", str(path)], env={"COLUMNS": "250"})
        assert result.exit_code == 2, result.output
        assert f"error: cannot read -f {path}: {words}" in result.stderr, result.stderr
        assert "Traceback" not in result.output and "Errno" not in result.stderr


def test_binary_device_config_is_one_line(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump_all([node("n1"), pod("p", 1000)]))
    binary = tmp_path / "device-config.yaml"
    binary.write_bytes(b"nvidia:\n  \xd0\xff\n")
    result = CliRunner().invoke(app, ["schedule", "-f", str(cluster), "--device-config-file",
                                      str(binary)], env={"COLUMNS": "250"})
    assert result.exit_code == 2, result.output
    assert f"error: cannot read device config {binary}: not UTF-8 text (byte 10)" \
        in result.stderr, result.stderr


def nameless(mem: int, generate_name: str = "") -> dict:
    meta = {"namespace": "team", **({"generateName": generate_name} if generate_name else {})}
    return {**pod("x", mem), "metadata": meta}


@pytest.mark.parametrize("columns", ["250", "80"])
def test_pods_without_a_name_are_shown_and_counted_apart(tmp_path: Path, columns: str) -> None:
    """A pod with only generateName (or no name at all) showed as ``team/``, and two of
    them were one pod in the dry run's ledger (the second's charge replaced the first's,
    so both 10000 MiB pods "fit" one 16384 MiB card)."""
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all([node("n1"), nameless(10000, "job-"),
                                        nameless(10000, "job-"), nameless(1000)]))
    result = CliRunner().invoke(app, ["schedule", "-f", str(path)], env={"COLUMNS": columns})
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.replace("│", " ").split())
    for label in ("team/job-<generated> (object 2 of the file)",
                  "team/job-<generated> (object 3 of the file)",
                  "team/<unnamed> (object 4 of the file)"):
        assert label in text, text
    assert "team/ " not in text
    report = json.loads(CliRunner().invoke(app, ["schedule", "-f", str(path), "-o", "json"],
                                           env={"COLUMNS": "250"}).stdout)
    first, second, third = report["pods"]
    assert (first["name"], first["generate_name"], first["object_index"]) == ("", "job-", 2)
    assert (third["generate_name"], third["object_index"]) == ("", 4)
    assert first["node"] == "n1" and third["node"] == "n1"
    assert second["node"] is None
    assert "CardInsufficientMemory" in second["failed_nodes"]["n1"]


@pytest.mark.parametrize("columns", ["250", "80"])
def test_names_in_the_file_are_shown_as_written_not_as_markup(tmp_path: Path,
                                                              columns: str) -> None:
    """Names are the file's text: ``[/x]`` in one was read as rich markup and crashed
    the table (MarkupError)."""
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all([node("n[/x]1"), node("bad[/y]", "hello"),
                                        pod("p[/z]", 10), nameless(10, "g[/w]-")]))
    result = CliRunner().invoke(app, ["schedule", "-f", str(path)], env={"COLUMNS": columns})
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.replace("│", " ").split())
    for shown in ("team/p[/z]", "team/g[/w]-<generated>", "n[/x]1", "node bad[/y] not "
                  "registered"):
        assert shown in text, text


@pytest.mark.parametrize("command", ["device-plugin", "dra-plugin"])
def test_unknown_backend_is_refused_before_any_io(tmp_path: Path, command: str) -> None:
    """``--backend foo`` was refused only after the device config, the kubeconfig and
    the API server: now first, in one line naming the valid backends, with nothing read
    or created (the device config and kubeconfig named do not exist)."""
    plugin_dir = tmp_path / "plugins"
    dirs = (["--device-plugin-path", str(plugin_dir)] if command == "device-plugin"
            else ["--plugin-dir", str(plugin_dir), "--registry-dir", str(plugin_dir)])
    result = CliRunner().invoke(app, [
        command, "--backend", "foo", "--node-name", "n1",
        "--device-config-file", str(tmp_path / "missing-config.yaml"),
        "--kubeconfig", str(tmp_path / "missing-kubeconfig"), *dirs],
        env={"COLUMNS": "250"})
    assert result.exit_code == 2, result.output
    assert result.stderr == "error: --backend must be one of nvml, fake, got 'foo'\n", \
        result.stderr
    assert not plugin_dir.exists()


@pytest.mark.parametrize(("args", "line"), [
    (["top", "-o", "yaml"], "error: -o/--output must be one of table, json, got 'yaml'"),
    (["top", "--output=wide"], "error: -o/--output must be one of table, json, got 'wide'"),
    (["schedule", "-f", "{cluster}", "-o", "yaml"],
     "error: -o/--output must be one of json, table, got 'yaml'"),
    (["scheduler", "--log-format", "yaml"],
     "error: --log-format must be one of keyvalue, json, got 'yaml'"),
    (["top", "--log-format=text"],
     "error: --log-format must be one of keyvalue, json, got 'text'"),
])
def test_bad_output_format_is_one_line(tmp_path: Path, args: list[str], line: str) -> None:
    """A format that is not offered was typer's boxed usage error; it is one line naming
    the valid ones, as hami's other usage errors (exit status 2), before anything is read
    (hami top's kubeconfig does not exist here)."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump_all([node("n1"), pod("p", 1000)]))
    args = [a.replace("{cluster}", str(cluster)) for a in args]
    result = CliRunner().invoke(app, args, env={
        "COLUMNS": "250", "KUBECONFIG": str(tmp_path / "missing-kubeconfig")})
    assert result.exit_code == 2, result.output
    assert result.stderr == line + "\n", result.stderr
    assert result.stdout == "", result.stdout


def test_good_output_formats_still_work(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump_all([node("n1"), pod("p", 1000)]))
    for fmt in ("json", "table"):
        result = CliRunner().invoke(app, ["schedule", "-f", str(cluster), "-o", fmt,
                                          "--log-format", "json"], env={"COLUMNS": "250"})
        assert result.exit_code == 0, result.output
        assert ('"schema": "hami.schedule/v1"' in result.stdout) == (fmt == "json")
