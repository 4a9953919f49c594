"""Test beds leave nothing under the temp dir (issue 28: 62-75 MB per run were left), and
the test node's kubelet is told not to write the host's iptables chains."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami.testing.chartbed import ChartBed
from hami.testing.gpubed import GpuBed


@pytest.mark.parametrize("bed_class", [GpuBed, ChartBed])
def test_own_temp_workdir_is_removed_at_stop(bed_class: type, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    monkeypatch.delenv("HAMI_KEEP_WORKDIR", raising=False)
    bed = bed_class()
    (bed.workdir / "logs").mkdir()
    (bed.workdir / "logs" / "kubelet.log").write_text("x" * 1000)
    bed.stop()  # also after a run: stop() is the one way out
    assert not bed.workdir.exists()


@pytest.mark.parametrize("bed_class", [GpuBed, ChartBed])
def test_workdir_kept_when_asked_or_given(bed_class: type, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HAMI_KEEP_WORKDIR", raising=False)
    kept = bed_class(keep_workdir=True)
    kept.stop()
    assert kept.workdir.is_dir()
    kept.workdir.rmdir()
    given = tmp_path / "bed"
    given.mkdir()
    bed = bed_class(workdir=given)
    bed.stop()
    assert given.is_dir()  # the caller's directory is the caller's
    monkeypatch.setenv("HAMI_KEEP_WORKDIR", "1")
    env_kept = bed_class()
    env_kept.stop()
    assert env_kept.workdir.is_dir()
    env_kept.workdir.rmdir()


def test_kubelet_makes_no_host_iptables_chains(tmp_path: Path) -> None:
    """The kubelet shares the host's network namespace; its KUBE-FIREWALL chain (drops
    connections from non-loopback sources to 127.0.0.0/8) stayed after the node stopped.
    The real-node tests check the host's chains too (tests/realnode/test_migration.py)."""
    import yaml

    from hami.testing.node import RealNode

    class _Cp:
        binaries = {"kube-apiserver": tmp_path / "kube-apiserver"}
        ca_file = tmp_path / "ca.crt"

    node = RealNode(_Cp(), "n", tmp_path / "node")  # type: ignore[arg-type]
    (tmp_path / "node").mkdir(exist_ok=True)
    cfg = yaml.safe_load(node._write_kubelet_config().read_text())
    assert cfg["makeIPTablesUtilChains"] is False
