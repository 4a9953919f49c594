"""The chart on older Kubernetes minors: what it gates on .Capabilities (docs/install.md,
"Kubernetes versions")."""

from __future__ import annotations

import pytest

from tests.deploy.chart import CHART, NAMESPACE, RELEASE, find, helm, render, render_notes

VAP_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


@pytest.mark.parametrize("version", ["v1.30.14", "v1.29.6", "v1.25.0"])
def test_below_the_floor_helm_refuses_in_one_line(version: str) -> None:
    proc = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                "--kube-version", version)
    assert proc.returncode != 0
    assert ">=1.31.0-0" in proc.stderr and version in proc.stderr, proc.stderr


def test_without_vap_the_notes_say_what_is_given_up() -> None:
    """The template's branch where admissionregistration.k8s.io/v1 VAP is not served
    (rendered on a chart copy without the floor: `helm template` can only say so by an
    older version)."""
    old = render_notes(kube_version="v1.29.6", below_floor=True)
    assert "serves no ValidatingAdmissionPolicy" in old and "v1.29.6" in old
    assert "allocation" in old
    assert "serves no ValidatingAdmissionPolicy" not in render_notes(kube_version="v1.31.14")
    off = render_notes({"admissionPolicy": {"enabled": False}}, kube_version="v1.29.6",
                       below_floor=True)
    assert "serves no ValidatingAdmissionPolicy" not in off  # turned off on purpose


@pytest.mark.parametrize("version", ["v1.31.14", "v1.33.13"])
def test_the_policies_render_where_vap_v1_is_served(version: str) -> None:
    objs = render(kube_version=version)
    assert {o["kind"] for o in objs} >= VAP_KINDS


@pytest.mark.parametrize("version", ["v1.31.14", "v1.33.13"])
def test_dra_mode_is_refused_before_1_34_in_one_line(version: str) -> None:
    proc = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                "--kube-version", version, "--set", "dra.enabled=true",
                "--set", "devicePlugin.enabled=false")
    assert proc.returncode != 0
    assert "DRA mode needs resource.k8s.io/v1" in proc.stderr and version in proc.stderr
    assert "dra.enabled=false" in proc.stderr


def test_dra_mode_renders_from_1_34() -> None:
    objs = render({"dra": {"enabled": True}, "devicePlugin": {"enabled": False}},
                  kube_version="v1.34.4")
    assert find(objs, "DeviceClass")


@pytest.mark.parametrize(("version", "tag"), [("v1.31.14", "v1.31.14"),
                                               ("v1.33.13", "v1.33.13")])
def test_the_kube_scheduler_tag_follows_the_cluster(version: str, tag: str) -> None:
    deploy = find(render(kube_version=version), "Deployment")
    images = [c["image"] for c in deploy["spec"]["template"]["spec"]["containers"]]
    assert any(i.endswith(f"kube-scheduler:{tag}") for i in images), images
    pinned = find(render({"scheduler": {"kubeScheduler": {"imageTag": "v1.30.0"}}},
                         kube_version=version), "Deployment")
    images = [c["image"] for c in pinned["spec"]["template"]["spec"]["containers"]]
    assert any(i.endswith("kube-scheduler:v1.30.0") for i in images), images


def test_a_server_listing_its_kinds_decides_over_the_version() -> None:
    """On install helm lists the server's group/version/Kind entries: a 1.31 server
    without VAP in admissionregistration.k8s.io/v1 (turned off) gets no policies, and the
    NOTES say so; with it, the policies render."""
    without = render(kube_version="v1.31.14", api_versions=["v1/Pod"])
    assert not [o for o in without if o["kind"] in VAP_KINDS]
    with_vap = render(kube_version="v1.31.14", api_versions=[
        "v1/Pod", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"])
    assert {o["kind"] for o in with_vap} >= VAP_KINDS


def test_dra_mode_follows_the_servers_kinds() -> None:
    values = ["--set", "dra.enabled=true", "--set", "devicePlugin.enabled=false"]
    base = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE,
            "--kube-version", "v1.37.2", "--api-versions", "v1/Pod", *values]
    refused = helm(*base)  # a 1.37 server with resource.k8s.io/v1 turned off
    assert refused.returncode != 0 and "DRA mode needs resource.k8s.io/v1" in refused.stderr
    served = helm(*base, "--api-versions", "resource.k8s.io/v1/DeviceClass")
    assert served.returncode == 0, served.stderr
