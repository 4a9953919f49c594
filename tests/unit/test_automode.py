"""Allocate mode ``auto``: the version parse and the choice table."""

from __future__ import annotations

import pytest

from hami.deviceplugin.automode import (
    Version,
    choose_allocate_mode,
    parse_runtime,
    parse_version,
)

KUBELET = "v1.31.0"


@pytest.mark.parametrize(("text", "want"), [
    ("2.4.2", Version((2, 4, 2), False)),
    ("v2.0.0-rc.1", Version((2, 0, 0), True)),
    ("1.7.20", Version((1, 7, 20), False)),
    ("1.7.12-0ubuntu4", Version((1, 7, 12), True)),
    ("v1.29.3+k3s1", Version((1, 29, 3), False)),
    ("1.31", Version((1, 31, 0), False)),
    ("", None), ("garbage", None), ("2", None), ("2.x.1", None), ("-1.2.3", None),
    ("1.2.3 rm -rf", None), ("9" * 10 + ".0.0", None), ("1." + "1" * 300, None),
])
def test_parse_version(text: str, want: Version | None) -> None:
    assert parse_version(text) == want


def test_parse_runtime() -> None:
    assert parse_runtime("containerd://2.4.2") == ("containerd", Version((2, 4, 2), False))
    assert parse_runtime("CRI-O://1.31.0") == ("cri-o", Version((1, 31, 0), False))
    assert parse_runtime("docker://abc") == ("docker", None)
    assert parse_runtime("containerd 2.0.0") is None
    assert parse_runtime("://2.0.0") is None
    assert parse_runtime("x://" + "1" * 300) is None


@pytest.mark.parametrize(("runtime", "kubelet", "mode", "why"), [
    ("containerd://2.4.2", KUBELET, "cdi", "applies CDI devices by default"),
    ("containerd://v2.0.0", KUBELET, "cdi", "applies"),
    ("containerd://2.1.0-rc.0", KUBELET, "cdi", "applies"),
    ("cri-o://1.31.0", KUBELET, "cdi", "applies"),
    ("cri-o://1.28.0", "v1.29.0-eks-1", "cdi", "applies"),
    # a pre-release of the first version with CDI on by default is before it
    ("containerd://v2.0.0-rc.1", KUBELET, "node-lock", "from 2.0.0 on"),
    ("containerd://1.7.20", KUBELET, "node-lock", "from 2.0.0 on"),
    ("containerd://1.6.33", KUBELET, "node-lock", "from 2.0.0 on"),
    ("cri-o://1.27.4", KUBELET, "node-lock", "from 1.28.0 on"),
    ("docker://26.1.0", KUBELET, "node-lock", "not known to apply CDI"),
    ("remote://1.0", KUBELET, "node-lock", "not known"),
    ("containerd://garbage", KUBELET, "node-lock", "does not parse"),
    ("containerd", KUBELET, "node-lock", "is not <runtime>://<version>"),
    ("", KUBELET, "node-lock", "reports no container runtime"),
    (None, KUBELET, "node-lock", "reports no container runtime"),
    # the kubelet must pass a device plugin's CDI devices on (on by default from 1.29)
    ("containerd://2.4.2", "v1.28.9", "node-lock", "from 1.29 on"),
    ("containerd://2.4.2", "", "node-lock", "does not parse"),
    ("containerd://2.4.2", None, "node-lock", "does not parse"),
])
def test_choice_table(runtime: str | None, kubelet: str | None, mode: str, why: str) -> None:
    got = choose_allocate_mode(runtime, kubelet, "hami-core")
    assert (got.mode, why in got.reason) == (mode, True), got.reason


def test_mig_always_takes_the_lock() -> None:
    got = choose_allocate_mode("containerd://2.4.2", KUBELET, "mig")
    assert got.mode == "node-lock" and "mig" in got.reason
    assert choose_allocate_mode("containerd://2.4.2", KUBELET, "mps").mode == "cdi"


def test_reasons_quote_hostile_text_shortened() -> None:
    got = choose_allocate_mode("evil\n" + "x" * 200 + "://1.0", KUBELET, "hami-core")
    assert got.mode == "node-lock"
    assert "\n" not in got.reason and len(got.reason) < 200
