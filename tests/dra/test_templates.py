"""DRA mode's template reconciler and the signed specs it trusts (the recording client
of test_webhook stands in for lightkube's AsyncClient; the pod watch path is
tests/integration/test_dra_templates.py, the real control plane tests/e2e/test_dra_e2e.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from hami.dra import signedspecs
from hami.dra import translate as tr
from hami.dra.templates import TemplateReconciler, missing_templates
from hami.keyring import KeyRing
from tests.dra.test_webhook import _api_error, _Client

NAME, OURS = tr.template_for(tr.claim_spec(1, 1000, 0, []))
KEY = b"a" * 40


class _Keys:
    def __init__(self, *keys: bytes) -> None:
        self.keys = keys

    def signing_key(self) -> bytes:
        return self.keys[0]

    def verifying_keys(self) -> tuple[bytes, ...]:
        return self.keys


def _pod(key: bytes | None = KEY, namespace: str = "ns", **status: Any) -> dict[str, Any]:
    annotations = signedspecs.sign(key, namespace, {NAME: OURS}) if key else {}
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u1",
                         "annotations": annotations},
            "spec": {"resourceClaims": [{"name": "gpu-0", "resourceClaimTemplateName": NAME}],
                     "containers": [{"name": "c"}]},
            "status": {"phase": "Pending", **status}}


def _reconcile(client: _Client, pod: dict[str, Any], *keys: bytes) -> tuple[dict[str, str],
                                                                            list[str]]:
    events: list[str] = []
    rec = TemplateReconciler(client, _Keys(*(keys or (KEY,))),
                             lambda meta, reason, message: events.append(message))
    return asyncio.run(rec.reconcile(pod)), events


def test_a_signed_pod_gets_its_template_and_a_second_look_finds_it() -> None:
    client = _Client()
    assert _reconcile(client, _pod()) == ({NAME: "created"}, [])
    assert client.created == [("ns", NAME)]
    assert client.objs[0]["spec"] == OURS["spec"]
    assert _reconcile(client, _pod()) == ({NAME: "exists"}, [])
    assert client.created == [("ns", NAME)]


def test_signatures_bind_the_namespace_the_spec_and_the_key() -> None:
    assert signedspecs.signed_templates([b"old" * 11, KEY], "ns",
                                        signedspecs.sign(KEY, "ns", {NAME: OURS})) == {NAME: OURS}
    cases = {
        "no hami.io/dra-claim-templates-signature": _pod(None),
        "signed for another namespace": _pod(namespace="other"),
        "not accepted": _pod(b"b" * 40),
    }
    for words, pod in cases.items():
        client = _Client()
        outcome, events = _reconcile(client, pod)
        assert outcome[NAME].startswith("refused") and words in outcome[NAME], outcome
        assert client.created == [] and len(events) == 1 and words in events[0]


def test_a_spec_changed_after_signing_is_refused_unparsed() -> None:
    """The specs are parsed only after the MAC holds: junk under a wrong MAC is refused
    as not matching, never as a parse error."""
    pod = _pod()
    pod["metadata"]["annotations"][signedspecs.SPECS_ANNOTATION] = "[" * 100000
    outcome, _ = _reconcile(_Client(), pod)
    assert "does not match its signature" in outcome[NAME]


def test_a_key_rotation_keeps_verifying_with_the_previous_key(tmp_path: Path) -> None:
    old, new = "o" * 64, "n" * 64
    (tmp_path / "current").write_text(old)
    pod = _pod(old.encode())
    (tmp_path / "current").write_text(new)
    (tmp_path / "previous").write_text(old)
    ring = KeyRing(tmp_path, recheck_s=0)
    client = _Client()
    rec = TemplateReconciler(client, ring)
    assert asyncio.run(rec.reconcile(pod)) == {NAME: "created"}


def test_a_concurrent_create_is_read_back_and_compared() -> None:
    """The GET finds nothing, the create answers 409 (another replica made it): the
    template is read again; hami's content is fine, another content refused."""

    class _Racing(_Client):
        racer: dict[str, Any] = {}

        async def create(self, obj: Any, namespace: str | None = None) -> None:
            self.templates[(str(namespace), NAME)] = self.racer
            raise _api_error(409, "already exists")

    forged = tr.template_for(tr.claim_spec(1, 30000, 0, []))[1]
    for racer, outcome in ((OURS, "exists"), (forged, "refused")):
        client = _Racing()
        client.racer = racer
        got, events = _reconcile(client, _pod())
        assert got[NAME].startswith(outcome), got
        assert client.gets == [("ns", NAME), ("ns", NAME)]
        assert bool(events) is (outcome == "refused")


class _Slow(_Client):
    """An API server whose reads take ``latency_s`` (a real one's take milliseconds)."""

    def __init__(self, latency_s: float) -> None:
        super().__init__()
        self.latency_s = latency_s

    async def get(self, res: Any, name: str, namespace: str | None = None) -> Any:
        await asyncio.sleep(self.latency_s)
        return await super().get(res, name, namespace)


async def _settled(rec: TemplateReconciler) -> None:
    """Until every reconcile that :meth:`TemplateReconciler.observe` started has ended
    (a test waits for that work itself: a pod observed while its last reconcile is still
    in flight is skipped, so a test that only slept would miss it on a slow machine)."""
    while rec._tasks:
        await asyncio.gather(*list(rec._tasks), return_exceptions=True)


@pytest.mark.parametrize("latency_s", [0.0, 0.05])
def test_an_api_error_is_raised_and_the_next_event_retries(latency_s: float) -> None:
    class _Down(_Slow):
        fail = True

        async def get(self, res: Any, name: str, namespace: str | None = None) -> Any:
            if self.fail:
                await asyncio.sleep(self.latency_s)
                raise _api_error(503, "unavailable")
            return await super().get(res, name, namespace)

    client = _Down(latency_s)

    async def scenario() -> None:
        rec = TemplateReconciler(client, _Keys(KEY))
        with pytest.raises(Exception, match="unavailable"):
            await rec.reconcile(_pod())
        rec.observe(_pod())
        await _settled(rec)
        assert client.created == []
        client.fail = False
        rec.observe(_pod())
        await _settled(rec)
        assert client.created == [("ns", NAME)]

    asyncio.run(scenario())


@pytest.mark.parametrize(("change", "wanted"), [
    ({}, [NAME]),
    ({"spec": {"nodeName": "n1"}}, []),
    ({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}, []),
    ({"status": {"phase": "Failed"}}, []),
    ({"status": {"resourceClaimStatuses": [{"name": "gpu-0", "resourceClaimName": "p-gpu-0"}]}},
     []),
    ({"spec": {"resourceClaims": [{"name": "x", "resourceClaimTemplateName": "tenant"}]}}, []),
    ({"spec": {"resourceClaims": "junk"}}, []),
    ({"spec": {"resourceClaims": [7, {"resourceClaimTemplateName": 3}]}}, []),
])
def test_missing_templates_only_for_pods_still_waiting(change: dict[str, Any],
                                                        wanted: list[str]) -> None:
    pod = _pod()
    for part, values in change.items():
        pod[part] = {**pod[part], **values}
    assert missing_templates(pod) == wanted


@pytest.mark.parametrize("latency_s", [0.0, 0.05])
def test_a_tenant_rewriting_the_signature_gets_one_event_and_is_not_remembered_whole(
        latency_s: float) -> None:
    """Pod annotations are mutable: a tenant rewriting the signature of a refused pod in a
    loop makes the reconciler look again (a signature copied from an admitted pod still
    gets the template), but the Warning Event is posted once per pod and template, not
    once per rewrite, and what is remembered per pod is a digest, not the tenant's text
    (up to the API's 256 KiB of annotations per pod, for up to MAX_REMEMBERED pods)."""
    client, events = _Slow(latency_s), []
    rec = TemplateReconciler(client, _Keys(KEY),
                             lambda meta, reason, message: events.append(message))

    async def scenario() -> None:
        for i in range(20):
            pod = _pod(None)
            pod["metadata"]["annotations"] = {
                signedspecs.SPECS_ANNOTATION: "[]",
                signedspecs.SIGNATURE_ANNOTATION: f"v1:junk:{i:04d}" * 10000}
            rec.observe(pod)
            await _settled(rec)
        assert len(client.gets) == 20 and client.created == []
        rec.observe(_pod())
        await _settled(rec)

    asyncio.run(scenario())
    assert len(events) == 1 and "not accepted" in events[0], events
    assert client.created == [("ns", NAME)]
    assert all(len(v) <= 64 for seen in rec._reported.values() for v in seen.values())


def test_a_signed_pod_that_breaks_the_security_rules_gets_no_template() -> None:
    """A pod created while the webhook was down (``failurePolicy: Ignore``) with a
    signature copied from an admitted pod, whose container is privileged: no template
    is made for it (the webhook would have refused it)."""
    pod = _pod()
    pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    client = _Client()
    outcome, events = _reconcile(client, pod)
    assert outcome[NAME].startswith("refused") and "privileged" in outcome[NAME], outcome
    assert client.created == [] and len(events) == 1
    host_pid = _pod()
    host_pid["spec"]["hostPID"] = True
    assert _reconcile(client, host_pid)[0][NAME].startswith("refused")
    assert client.created == []


def test_a_signed_pod_whose_gpu_container_sets_a_reserved_env_gets_no_template() -> None:
    """The same pod with a container using hami's template that sets the memory limit
    itself: the webhook would have refused it (a reserved name of GPU containers), so the
    reconciler, which has the device config, refuses too; a container that does not use
    the template may set it."""
    from hami.devices.registry import make_config

    pod = _pod()
    pod["spec"]["containers"] = [
        {"name": "c", "resources": {"claims": [{"name": "gpu-0"}]},
         "env": [{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "1t"}]}]
    client = _Client()
    events: list[str] = []
    rec = TemplateReconciler(client, _Keys(KEY), lambda m, r, msg: events.append(msg),
                             config=make_config())
    outcome = asyncio.run(rec.reconcile(pod))
    assert outcome[NAME].startswith("refused") and "CUDA_DEVICE_MEMORY_LIMIT" in outcome[NAME]
    assert client.created == [] and len(events) == 1
    pod["spec"]["containers"] = [{"name": "c", "resources": {"claims": [{"name": "gpu-0"}]}},
                                 {"name": "other",
                                  "env": [{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "1t"}]}]
    pod["metadata"]["uid"] = "u2"
    assert asyncio.run(rec.reconcile(pod)) == {NAME: "created"}
