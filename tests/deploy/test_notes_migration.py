"""NOTES.txt for operators coming from HAMi (issue 28): where the changed defaults are,
the signing key left behind by an uninstall, the way to strict signing from trust mode,
and a warning when no registry is set for hami's images."""

from __future__ import annotations

from tests.deploy.chart import render_notes


def test_notes_point_at_the_changed_defaults_and_the_kept_key() -> None:
    notes = render_notes({"global": {"imageRegistry": "registry.example.com"}})
    assert "docs/differences.md" in notes and '"Moving from HAMi"' in notes
    assert "helm uninstall keeps the Secret hami-allocation-key" in notes
    assert "hami.invalid" not in notes
    assert "trustUnsignedAllocations" not in notes


def test_notes_say_how_to_leave_trust_mode() -> None:
    notes = render_notes({"global": {"imageRegistry": "r.example.com"},
                          "allocationSigning": {"trustUnsignedAllocations": True}})
    assert 'Once `hami top` says "no unsigned\nallocation left"' in notes
    assert ("helm upgrade hami <chart> -n hami-system --reuse-values --set "
            "allocationSigning.trustUnsignedAllocations=false") in notes


def test_notes_warn_when_hamis_images_have_no_registry() -> None:
    notes = render_notes()
    assert "WARNING: no registry is set for hami's images" in notes
    assert "make images REGISTRY=<registry>" in notes


def test_notes_beside_hami_say_to_name_the_scheduler() -> None:
    """Beside HAMi (forceOverwriteDefaultScheduler=false) hami's webhook does not set the
    scheduler: NOTES said it did (seen in the migration walkthrough, path A)."""
    default = render_notes({"global": {"imageRegistry": "r.example.com"}})
    assert "The webhook sets schedulerName: hami-scheduler on such pods." in default
    beside = render_notes({"global": {"imageRegistry": "r.example.com"},
                           "schedulerName": "hami-py-scheduler",
                           "scheduler": {"forceOverwriteDefaultScheduler": False}})
    assert "The webhook sets schedulerName" not in beside
    assert "set schedulerName: hami-py-scheduler yourself" in beside
