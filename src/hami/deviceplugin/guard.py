"""Which allocations the device plugin serves: only those hami's scheduler wrote.

An Allocate serves what the chosen pod's annotations say; the webhook strips
hand-written ones at creation and the chart's admission policy refuses later edits, and
this guard makes the plugin itself refuse what it cannot authenticate: the pod's
``spec.schedulerName`` must be hami's, its ``hami.io/vgpu-allocation-signature`` must
verify (HMAC over pod UID, node and grant, :mod:`hami.core.provenance`) with a key of
the shared key directory (:mod:`hami.keyring`), and the to-allocate string may only lag
the signed grant. ``--trust-unsigned-allocations`` turns the guard off (HAMi-written
allocations during a migration from HAMi, or pods of a scheduler such as Volcano's
vGPU plugin that writes HAMi's annotations). Without a key directory and without that
flag the guard has no key and serves nothing (HAMi serves every allocation).
"""

from __future__ import annotations

from dataclasses import dataclass

from hami.core.provenance import SignatureError, check_to_allocate, verify
from hami.deviceplugin.allocate import AllocateError, PodView
from hami.keyring import KeyRing


@dataclass(frozen=True)
class AllocationGuard:
    """Refuses allocations not written by ``scheduler_name`` with a key of ``keyring``;
    ``keyring`` None (no key configured) refuses every allocation."""

    keyring: KeyRing | None
    scheduler_name: str = "hami-scheduler"

    def signed_for(self, pod: PodView, node: str) -> bool:
        """The pod carries hami's allocation for ``node`` (its scheduler and a valid
        signature), whatever its progress."""
        if pod.scheduler_name != self.scheduler_name or self.keyring is None:
            return False
        try:
            verify(self.keyring.verifying_keys(), pod.uid, node, pod.annotations)
        except SignatureError:
            return False
        return True

    def check(self, pod: PodView, node: str) -> None:
        """Raises :class:`AllocateError` (with the reason) unless the pod's allocation is
        hami's scheduler's, signed for this pod and node."""
        who = f"{pod.namespace}/{pod.name}"
        if self.keyring is None:
            raise AllocateError(f"{who}: not served: this device plugin has no "
                                "--allocation-key-dir, so it cannot tell hami's allocations "
                                "from forged ones (pass the scheduler's key directory, or "
                                "--trust-unsigned-allocations to serve unsigned ones)")
        if pod.scheduler_name != self.scheduler_name:
            raise AllocateError(f"{who}: schedulerName {pod.scheduler_name!r} is not "
                                f"{self.scheduler_name!r}; its allocation is not served")
        try:
            verify(self.keyring.verifying_keys(), pod.uid, node, pod.annotations)
            check_to_allocate(pod.annotations)
        except SignatureError as exc:
            raise AllocateError(f"{who}: {exc}") from None
