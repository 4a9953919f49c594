"""deploy/local/quickstart.py prints its builds' progress: their lines as they come and a
"still building" line while a build is quiet (a Go build is silent for minutes)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.deploy.chart import ROOT


def _quickstart() -> ModuleType:
    spec = importlib.util.spec_from_file_location("quickstart_under_test",
                                                  ROOT / "deploy/local/quickstart.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "build.sh"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_a_quiet_build_prints_that_it_is_still_building(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    qs = _quickstart()
    argv = [_script(tmp_path, "echo 'build.sh: building etcd ...'\nsleep 1\n"
                              "echo 'build.sh: built etcd in 1s' >&2\necho /some/bin\n")]
    assert qs.run_build(argv, "Kubernetes", heartbeat_s=0.3) == "/some/bin"
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "    build.sh: building etcd ..."
    assert any(line.startswith("    ... still building Kubernetes (0m0") for line in out)
    assert "    build.sh: built etcd in 1s" in out  # stderr too, in order
    assert out[-1] == "    /some/bin"


def test_a_failed_build_stops_the_quickstart(tmp_path: Path) -> None:
    qs = _quickstart()
    with pytest.raises(SystemExit, match="failed \\(exit 3\\)"):
        qs.run_build([_script(tmp_path, "echo no go >&2\nexit 3\n")], "helm", heartbeat_s=5)


@pytest.mark.parametrize(("status", "keep", "removed"), [(0, False, True), (1, False, False),
                                                         (0, True, False)])
def test_own_temp_workdir_is_removed_after_a_good_run(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, status: int, keep: bool,
        removed: bool) -> None:
    """Issue 28: every run left its 60-80 MB work dir under the temp dir. A run without
    --keep removes its own temp dir when it succeeded; a failed run keeps it for its logs,
    as does --keep."""
    import tempfile

    qs = _quickstart()
    made: list[Path] = []

    def mkdtemp(prefix: str = "") -> str:
        path = tmp_path / f"{prefix}x"
        path.mkdir()
        (path / "apiserver.log").write_text("log")
        made.append(path)
        return str(path)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(qs, "build_tools", lambda: (tmp_path, "helm"))
    monkeypatch.setattr(qs, "run", lambda *a, **k: status)
    monkeypatch.setattr(qs.signal, "signal", lambda *a: None)  # leave pytest's handlers
    assert qs.main(["--keep"] if keep else []) == status
    assert made and made[0].exists() is not removed
    given = tmp_path / "given"
    assert qs.main(["--workdir", str(given)]) == status
    assert given.is_dir()  # a directory the user named is the user's
