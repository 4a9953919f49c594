"""The register loop compares the Node's annotations with what it wants there, not with
what it sent last: a Node deleted and re-created, or an annotation removed or altered by
someone else, is re-written on the next pass; a pass where the Node already carries the
value writes nothing; a missing Node (404) is logged once and retried, never a crash."""

from __future__ import annotations

import logging
import time

import pytest

from hami.api import names
from hami.deviceplugin.config import PluginConfig
from hami.deviceplugin.discovery import PhysicalGpu
from hami.deviceplugin.kube import NodeWatch
from hami.deviceplugin.register import encode_register
from hami.deviceplugin.service import DeviceState, NodeRegistrar
from tests.node.conftest import NODE, PluginHarness, start_plugin
from tests.node.fakes import FakeKube

GPU = PhysicalGpu("GPU-7e9e0000-1111-2222-3333-444444444444", 0, "Tesla T4", 16 * 1024 ** 3)


def _registrar(kube: FakeKube) -> NodeRegistrar:
    return NodeRegistrar(DeviceState([GPU], PluginConfig()), kube, NODE)


def _register_value(kube: FakeKube) -> str | None:
    return kube.nodes[NODE][0].get(names.NODE_REGISTER) if NODE in kube.nodes else None


def test_node_deleted_and_recreated_is_registered_again() -> None:
    kube = FakeKube()
    kube.add_node(NODE)
    reg = _registrar(kube)
    assert reg.once() is True
    wanted = _register_value(kube)
    assert wanted is not None and GPU.uuid in wanted
    kube.delete_node(NODE)
    assert reg.once() is False  # retried soon, no exception
    kube.add_node(NODE)  # the new Node object carries none of our annotations
    assert reg.once() is True
    assert _register_value(kube) == wanted


@pytest.mark.parametrize("other", [None, "[]", "garbage {"])
def test_register_annotation_removed_or_altered_is_rewritten(other: str | None) -> None:
    kube = FakeKube()
    kube.add_node(NODE)
    reg = _registrar(kube)
    assert reg.once() is True
    wanted = _register_value(kube)
    kube.patch_node_annotations(NODE, {names.NODE_REGISTER: other})
    assert reg.once() is True
    assert _register_value(kube) == wanted


def test_no_write_while_the_node_carries_the_value() -> None:
    kube = FakeKube()
    kube.add_node(NODE, {names.NODE_REGISTER: encode_register(
        DeviceState([GPU], PluginConfig()).devices)})
    reg = _registrar(kube)
    for _ in range(5):
        assert reg.once() is True
    assert kube.calls.count("patch_node") == 0
    assert reg.patches == 0


def test_watched_copy_is_read_without_api_calls() -> None:
    """With a live node watch a pass reads the watched copy: no GET, and no PATCH once our
    own patch response was offered to the copy."""
    kube = FakeKube()
    kube.add_node(NODE)
    kube.node_watch = NodeWatch(None, NODE)
    kube.node_watch.offer({}, "1")
    reg = _registrar(kube)
    assert reg.once() is True
    assert kube.calls == ["patch_node"]
    for _ in range(3):
        assert reg.once() is True
    assert kube.calls == ["patch_node"]
    kube.node_watch.offer({"other": "x"}, "7")  # the watch saw the annotation vanish
    assert reg.once() is True
    assert kube.calls == ["patch_node", "patch_node"]
    assert _register_value(kube) is not None


def test_missing_node_is_logged_once_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    kube = FakeKube()
    reg = _registrar(kube)
    with caplog.at_level(logging.INFO, logger="hami.deviceplugin.service"):
        for _ in range(4):
            assert reg.once() is False
        warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warned) == 1 and NODE in warned[0].getMessage()
        assert "not found" in warned[0].getMessage()
        kube.add_node(NODE)
        assert reg.once() is True
        assert _register_value(kube) is not None
        kube.delete_node(NODE)  # gone again: one more warning, not one per pass
        for _ in range(3):
            assert reg.once() is False
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 2


def _wait(pred, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_running_plugin_reregisters_a_recreated_node(harness: PluginHarness) -> None:
    """The whole plugin (register interval 0.3 s): the Node vanishes for a while and comes
    back bare; the register annotation is back within a few periods and the plugin lives."""
    start_plugin(harness)
    harness.kubelet.wait_registered()
    assert _wait(lambda: _register_value(harness.kube) is not None, 10)
    wanted = _register_value(harness.kube)
    patches = harness.kube.calls.count("patch_node")
    time.sleep(1.0)  # about three periods with nothing changed: nothing written
    assert harness.kube.calls.count("patch_node") == patches
    harness.kube.delete_node(NODE)
    time.sleep(1.0)
    harness.kube.add_node(NODE)
    assert _wait(lambda: _register_value(harness.kube) == wanted, 5), \
        "register annotation not re-written on the re-created node"
    assert harness.thread is not None and harness.thread.is_alive() and not harness.errors


@pytest.mark.parametrize(("trust", "value"), [(True, "true"), (False, "false"), (None, None)])
@pytest.mark.parametrize("before", [None, "true", "false", "TRUE", "yes"])
def test_signing_mode_annotation_follows_the_plugin(trust: bool | None, value: str | None,
                                                    before: str | None) -> None:
    """The plugin's signing mode on its Node (hami top reads it): "true" when it trusts
    unsigned allocations, "false" in strict signing, removed by a registrar not told the
    mode; whatever the Node carried before (another mode, a hand-written value) is
    replaced on the next pass, and the register annotation is written with it."""
    kube = FakeKube()
    kube.add_node(NODE, {} if before is None else {names.NODE_TRUST_UNSIGNED: before})
    reg = NodeRegistrar(DeviceState([GPU], PluginConfig()), kube, NODE, trust_unsigned=trust)
    assert reg.once() is True
    annotations = kube.nodes[NODE][0]
    assert annotations.get(names.NODE_TRUST_UNSIGNED) == value
    assert names.NODE_TRUST_UNSIGNED in annotations or value is None
    assert _register_value(kube) is not None
    kube.patch_node_annotations(NODE, {names.NODE_TRUST_UNSIGNED: "garbage"})
    assert reg.once() is True
    assert kube.nodes[NODE][0].get(names.NODE_TRUST_UNSIGNED) == value
