"""The monitor writes its decisions into each container's feedback file (the read-only
file libvgpu trusts, :mod:`hami.deviceplugin.feedbackfile`) every tick, besides the
region's fields; nothing a container does in its own cache directory changes what that
file says about it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hami.deviceplugin import feedbackfile
from hami.monitor.claims import ClaimLister
from hami.monitor.command import feedback_tick
from hami.monitor.lister import ContainerLister
from tests.node.regionfile import RegionSpec, build, read_feedback
from tests.node.test_monitor import U0, pod, put
from tests.node.test_monitor_dra import (
    CLAIM_UID,
    POD_UID,
    STUB_UUID0,
    _claim_on_disk,
    lister_stub,
    pod_view,
)

RK = 2_008_904  # recent_kernel's offset in a v1 region


def plugin_file(root: Path, key: str) -> Path:
    """``<root>/<key>.plugin/feedback`` as the device plugin creates it at Allocate."""
    path = root / f"{key}.plugin" / feedbackfile.FEEDBACK_FILE
    feedbackfile.create(str(path))
    return path


def launch_mark(cache: Path) -> None:
    """What libvgpu does at every launch: recent_kernel = 2 in the region."""
    with open(cache, "r+b") as f:
        f.seek(RK)
        f.write((2).to_bytes(4, "little"))


def two_containers(tmp_path: Path) -> tuple[Path, dict[str, Path], dict[str, Path], list]:  # type: ignore[type-arg]
    """A priority-0 container ``h_c`` and a priority-1 one ``l_c`` on one GPU, both active."""
    root = tmp_path / "c"
    caches = {k: put(root, f"{k}_c", build(RegionSpec(uuids=(U0,), priority=p, recent_kernel=2)))
              for k, p in (("h", 0), ("l", 1))}
    files = {k: plugin_file(root, f"{k}_c") for k in caches}
    pods = [pod("h", "h", ("c",), gpus=(U0,), priority=0), pod("l", "l", ("c",), gpus=(U0,), priority=1)]
    return root, caches, files, pods


def test_a_tick_writes_each_containers_feedback_file_and_region(tmp_path: Path) -> None:
    root, caches, files, pods = two_containers(tmp_path)
    inodes = {k: f.stat().st_ino for k, f in files.items()}
    lister = ContainerLister(root)
    lister.update({"h", "l"})
    feedback_tick(lister, pods)  # hi active -> lo blocked and limited
    assert feedbackfile.decode(files["h"].read_bytes()) == (0, False)
    assert feedbackfile.decode(files["l"].read_bytes()) == (1, True)
    assert read_feedback(caches["l"].read_bytes()) == (1, -1)  # HAMi's tools still see it
    feedback_tick(lister, pods)  # hi decays: lo unblocked, both free
    assert feedbackfile.decode(files["l"].read_bytes()) == (0, False)
    assert read_feedback(caches["l"].read_bytes()) == (0, 0)
    # rewritten in place: a container's bind mount pins the inode
    assert {k: f.stat().st_ino for k, f in files.items()} == inodes
    lister.close()


def _delete(cache: Path) -> None:
    cache.unlink()


def _garble(cache: Path) -> None:
    cache.write_bytes(b"\0" * 4096)


def _replace(cache: Path) -> None:
    """A new region saying "uncontended, just launched" under the same name."""
    cache.unlink()
    cache.write_bytes(bytes(build(RegionSpec(uuids=(U0,), priority=1, utilization_switch=0,
                                             recent_kernel=2))))


@pytest.mark.parametrize("tamper", [_delete, _garble, _replace])
def test_a_container_cannot_free_itself_through_its_cache_dir(tmp_path: Path, tamper: object) -> None:
    """While it is free (uncontended, unblocked) the low-priority container removes,
    garbles or replaces its region and writes a feedback file of its own into its cache
    dir, hoping to freeze that state: once its priority-0 neighbour launches, its real
    feedback file says blocked all the same."""
    root, caches, files, pods = two_containers(tmp_path)
    lister = ContainerLister(root)
    lister.update({"h", "l"})
    feedback_tick(lister, pods)
    feedback_tick(lister, pods)  # both idle now
    assert feedbackfile.decode(files["l"].read_bytes()) == (0, False)
    assert callable(tamper)
    tamper(caches["l"])
    own = caches["l"].parent / feedbackfile.FEEDBACK_FILE
    own.write_bytes(feedbackfile.encode(0, False))
    for _ in range(3):  # the budget allows 9 blocked ticks of 12
        launch_mark(caches["h"])
        lister.update({"h", "l"})
        feedback_tick(lister, pods)
        assert feedbackfile.decode(files["l"].read_bytes()) == (1, True)
        assert feedbackfile.decode(files["h"].read_bytes()) == (0, False)
    assert feedbackfile.decode(own.read_bytes()) == (0, False)  # not the monitor's to write
    lister.close()


def test_a_pod_without_a_feedback_file_gets_its_region_written_and_no_file(tmp_path: Path) -> None:
    """HAMi's device plugin (or one older than the file) made no ``.plugin/feedback``:
    the tick writes the region as before and creates nothing."""
    root = tmp_path / "c"
    cache = put(root, "o_c", build(RegionSpec(uuids=(U0,), priority=1, recent_kernel=2)))
    lister = ContainerLister(root)
    lister.update({"o"})
    feedback_tick(lister, [pod("o", "o", ("c",), gpus=(U0,), priority=1)])
    assert read_feedback(cache.read_bytes()) == (0, 1)
    assert not (root / "o_c.plugin").exists()
    lister.close()


def test_a_file_that_is_not_a_feedback_file_is_left_alone(tmp_path: Path) -> None:
    root, _, files, pods = two_containers(tmp_path)
    files["l"].write_bytes(b"not a feedback file")
    lister = ContainerLister(root)
    lister.update({"h", "l"})
    feedback_tick(lister, pods)  # logged, not raised
    assert files["l"].read_bytes() == b"not a feedback file"
    assert "l_c" in lister.feedback_errors
    assert feedbackfile.decode(files["h"].read_bytes()) == (0, False)
    lister.close()


def test_a_dra_claims_feedback_file_is_written(tmp_path: Path) -> None:
    """DRA mode: the kubelet plugin created ``claims/<uid>.plugin/feedback`` (limited);
    the claim alone on its GPU is uncontended after a tick."""
    d = _claim_on_disk(tmp_path)
    fb = d.parent / f"{d.name}.plugin" / feedbackfile.FEEDBACK_FILE
    assert feedbackfile.decode(fb.read_bytes()) == (1, False)
    ino = fb.stat().st_ino
    claims = ClaimLister(d.parent)
    claims.update()
    feedback_tick(lister_stub(tmp_path), [pod_view()], claims)
    assert feedbackfile.decode(fb.read_bytes()) == (0, False)
    assert fb.stat().st_ino == ino
    claims.close()


def test_create_resets_in_place_and_refuses_a_symlink(tmp_path: Path) -> None:
    path = tmp_path / "x.plugin" / "feedback"
    feedbackfile.create(str(path))
    ino = path.stat().st_ino
    feedbackfile.write(str(path), 0, True)
    feedbackfile.create(str(path))  # Allocate again: same inode, safe values
    assert (path.stat().st_ino, feedbackfile.decode(path.read_bytes())) == (ino, (1, False))
    link = tmp_path / "x.plugin" / "link"
    os.symlink(path, link)
    with pytest.raises(OSError):
        feedbackfile.create(str(link))
    with pytest.raises(feedbackfile.FeedbackFileError):
        feedbackfile.write(str(link), 0, False)


def test_a_dra_claim_cannot_freeze_its_free_state_by_garbling_its_region(tmp_path: Path) -> None:
    """Two claims on one card, their pods of priority 0 and 1, both idle: the low one is
    free. It garbles its region; once the high one launches, its file says blocked."""
    hi_uid, lo_uid = CLAIM_UID, CLAIM_UID[:-1] + "2"
    hi_pod, lo_pod = POD_UID, POD_UID[:-1] + "2"
    idle = bytes(build(RegionSpec(uuids=(STUB_UUID0,), recent_kernel=0)))
    hi = _claim_on_disk(tmp_path, hi_uid, hi_pod, idle)
    lo = _claim_on_disk(tmp_path, lo_uid, lo_pod, idle)
    fb = lo.parent / f"{lo_uid}.plugin" / feedbackfile.FEEDBACK_FILE
    pods = [pod_view(hi_pod, priority="0"), pod_view(lo_pod, priority="1")]
    claims = ClaimLister(lo.parent)
    claims.update()
    feedback_tick(lister_stub(tmp_path), pods, claims)
    assert feedbackfile.decode(fb.read_bytes()) == (0, False)
    (lo / "4b1d.cache").write_bytes(b"\0" * 4096)
    launch_mark(hi / "4b1d.cache")
    claims.update()
    feedback_tick(lister_stub(tmp_path), pods, claims)
    assert feedbackfile.decode(fb.read_bytes()) == (1, True)
    claims.close()
