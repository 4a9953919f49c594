"""The real node's containerd choice and configuration (hami.testing.containerd)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from hami.testing.containerd import (
    BINARIES,
    PINNED_CONTAINERD_VERSION,
    NodeRuntimeConfig,
    config_toml,
    find_containerd,
    parse_major,
    parse_major_minor,
    selected_containerd_version,
)
from hami.testing.nodeprereq import missing_prerequisites

REPO = Path(__file__).resolve().parents[2]
CFG = NodeRuntimeConfig(Path("/tmp/hk1/containerd.sock"), "hami.local/pause:test",
                        "/usr/lib/cni", Path("/tmp/hk1/cni/net.d"), ("/run/cdi",))


def test_version_matches_go_mod() -> None:
    go_mod = (REPO / "hack" / "containerd" / "go.mod").read_text()
    pinned = re.search(r"^\s*(?:require\s+)?github\.com/containerd/containerd/v2 (v\S+)",
                       go_mod, re.M)
    assert pinned and pinned.group(1) == PINNED_CONTAINERD_VERSION
    for name in BINARIES:  # build.sh builds what go.mod lists as tools
        assert f"github.com/containerd/containerd/v2/cmd/{name}\n" in go_mod


@pytest.mark.parametrize("version", sorted(
    p.name for p in (REPO / "hack" / "containerd" / "versions").iterdir()))
def test_other_pins_name_their_release(version: str) -> None:
    go_mod = (REPO / "hack" / "containerd" / "versions" / version / "go.mod").read_text()
    module = "github.com/containerd/containerd" + ("/v2" if version.startswith("v2.") else "")
    assert re.search(rf"^\s*{re.escape(module)} {re.escape(version)}( |$)", go_mod, re.M)
    for name in BINARIES:
        assert f"{module}/cmd/{name}\n" in go_mod


@pytest.mark.parametrize(("raw", "version"), [
    (None, PINNED_CONTAINERD_VERSION), ("", PINNED_CONTAINERD_VERSION),
    ("1.7.35", "v1.7.35"), ("v2.4.2", "v2.4.2"),
])
def test_selected_version(raw: str | None, version: str) -> None:
    env = {} if raw is None else {"HAMI_CONTAINERD_VERSION": raw}
    assert selected_containerd_version(env) == version


@pytest.mark.parametrize("raw", ["latest", "1.7", "../../etc", "v1.7.35; rm"])
def test_selected_version_rejects_other_words(raw: str) -> None:
    with pytest.raises(ValueError, match="not a release"):
        selected_containerd_version({"HAMI_CONTAINERD_VERSION": raw})


@pytest.mark.parametrize(("out", "major"), [
    ("containerd github.com/containerd/containerd/v2 v2.4.2 hami-hack-containerd\n", 2),
    ("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3\n", 1),
])
def test_parse_major(out: str, major: int) -> None:
    assert parse_major(out) == major


def test_parse_major_minor() -> None:
    assert parse_major_minor("containerd github.com/containerd/containerd v1.7.35 x\n") == (1, 7)


def test_parse_major_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="no version"):
        parse_major("containerd: command not found")


def test_v3_config_has_cdi_cgroupfs_cni_and_pinned_sandbox() -> None:
    doc = tomllib.loads(config_toml(2, CFG))
    assert doc["version"] == 3
    assert doc["grpc"]["address"] == "/tmp/hk1/containerd.sock"
    assert "io.containerd.nri.v1.nri" in doc["disabled_plugins"]
    images = doc["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"]["sandbox"] == "hami.local/pause:test"
    assert images["snapshotter"] == "overlayfs"
    rt = doc["plugins"]["io.containerd.cri.v1.runtime"]
    assert rt["cdi_spec_dirs"] == ["/run/cdi"]
    runc = rt["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"]["SystemdCgroup"] is False
    assert rt["cni"] == {"bin_dirs": ["/usr/lib/cni"], "conf_dir": "/tmp/hk1/cni/net.d",
                         "max_conf_num": 1}
    assert "io.containerd.grpc.v1.cri" not in doc["plugins"]


def test_v2_config_for_containerd_1() -> None:
    doc = tomllib.loads(config_toml(1, CFG))
    assert doc["version"] == 2
    cri = doc["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "hami.local/pause:test"
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    assert cri["cni"]["bin_dir"] == "/usr/lib/cni"
    assert "cdi_spec_dirs" not in cri and "enable_cdi" not in cri  # 1.6: no CDI


def test_v2_config_for_containerd_1_7_turns_cdi_on() -> None:
    doc = tomllib.loads(config_toml(1, CFG, minor=7))
    assert doc["version"] == 2
    cri = doc["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["enable_cdi"] is True and cri["cdi_spec_dirs"] == ["/run/cdi"]
    assert cri["sandbox_image"] == "hami.local/pause:test"


def _fake_build(tmp_path: Path, version: str) -> Path:
    for name in BINARIES:
        exe = tmp_path / name
        exe.write_text(f"#!/bin/sh\necho containerd github.com/containerd/containerd/v2 {version} x\n")
        exe.chmod(0o755)
    return tmp_path


def test_find_containerd_prefers_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HAMI_CONTAINERD", raising=False)
    found = find_containerd(_fake_build(tmp_path, "v2.4.2"))
    assert found.bin_dir == tmp_path and found.major == 2 and found.has_cdi
    assert found.binary("ctr") == str(tmp_path / "ctr")
    assert found.path_env("/usr/bin").split(":")[0] == str(tmp_path)


def test_find_containerd_system_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_path = tmp_path / "path"
    fake_path.mkdir()
    _fake_build(fake_path, "1.6.20~ds1")
    monkeypatch.setenv("PATH", str(fake_path))
    monkeypatch.setenv("HAMI_CONTAINERD", "system")
    built = tmp_path / "built"
    built.mkdir()
    found = find_containerd(_fake_build(built, "v2.4.2"))
    assert found.bin_dir is None and found.major == 1 and not found.has_cdi
    assert found.binary("containerd") == "containerd"


def _missing_tools(reasons: list[str]) -> set[str]:
    for r in reasons:
        if r.startswith("missing "):
            return set(r.removeprefix("missing ").split(" (")[0].split(", "))
    return set()


def test_prerequisites_accept_the_build_instead_of_debian(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("HAMI_CONTAINERD", raising=False)
    assert set(BINARIES) <= _missing_tools(missing_prerequisites(None, empty))
    built = tmp_path / "built"
    built.mkdir()
    missing = _missing_tools(missing_prerequisites(None, _fake_build(built, "v2.4.2")))
    assert not set(BINARIES) & missing and "runc" in missing
