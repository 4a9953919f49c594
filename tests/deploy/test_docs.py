"""docs/: relative links resolve, and the chart values the docs name exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.deploy.chart import CHART, ROOT

DOCS = sorted((ROOT / "docs").rglob("*.md"))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path) -> None:
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
        if "://" in target:
            continue
        assert (doc.parent / target).exists(), f"{doc.name}: {target}"


def _has(values: dict, dotted: str) -> bool:  # type: ignore[type-arg]
    node: object = values
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_configuration_reference_names_real_values() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    text = (ROOT / "docs" / "configuration.md").read_text()
    table = text.split("## Chart values", 1)[1].split("## Device config", 1)[0]
    names = re.findall(r"^\| `([^`]+)`", table, re.M)
    assert len(names) > 40
    for name in names:
        if "{" in name:  # `a.b.{c,d}`
            head, alts = re.match(r"(.*)\.\{(.*)\}", name).groups()  # type: ignore[union-attr]
            candidates = [f"{head}.{a}" for a in alts.split(",")]
        elif name.endswith(".*"):
            candidates = [name[:-2]]
        else:
            candidates = [name]
        for cand in candidates:
            assert _has(values, cand), f"docs/configuration.md names {cand}, not in values.yaml"
    for key in re.findall(r"`([a-zA-Z]+(?:\.[a-zA-Z-]+)+)`", text):
        if key.split(".")[0] in values and not key.endswith((".yaml", ".json", ".md")):
            assert _has(values, key) or _has(values, key.rsplit(".", 1)[0]), key


USER_TEXT = [ROOT / "README.md", *DOCS, *sorted((ROOT / "docs").rglob("*.yaml")),
             *sorted((ROOT / "deploy").rglob("*.yaml")), *sorted((ROOT / "deploy").rglob("*.txt"))]


@pytest.mark.parametrize("path", USER_TEXT, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_use_the_current_option_names(path: Path) -> None:
    """The hidden old spellings (``--node-policy``, ``--device-config``, ...) appear only
    where a line says they are the old spellings."""
    from hami.cli.compat import ALIASES

    for n, line in enumerate(path.read_text().splitlines(), 1):
        for old, new in ALIASES.items():
            if re.search(re.escape(old) + r"(?![\w-])", line) and "old spelling" not in line:
                raise AssertionError(f"{path.relative_to(ROOT)}:{n} uses {old}; write {new}")


def test_vendor_guide_covers_every_chart_vendor() -> None:
    """docs/vendors.md is a user guide: every vendor the chart can enable, with its resource
    names and how to enable it; the design history lives in docs/dev/."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())["devices"]
    guide = (ROOT / "docs" / "vendors.md").read_text()
    for key, vendor in values["vendors"].items():
        assert f"(`{key}`" in guide, key
        for resource in vendor["resources"]:
            assert f"`{resource}" in guide, resource
    for key in ("ascend", "iluvatar"):
        assert f"--set devices.{key}.enabled=true" in guide
    assert "--set devices.vendors." in guide and "```yaml" in guide
    assert "## The interface" not in guide  # the developer's part is in docs/dev
    assert "## The interface" in (ROOT / "docs" / "dev" / "vendors-design.md").read_text()


CITATIONS = re.compile(r"shared/(specs|design|data)|spec §|hami-core-spec|ARCHITECTURE\.md")


def test_no_user_text_cites_files_outside_the_repository() -> None:
    """README, docs, deploy, native READMEs and src (help texts, messages, docstrings)
    never point readers at the project's private notes."""
    roots = [ROOT / "README.md", ROOT / "native" / "libvgpu" / "README.md",
             *(p for d in ("docs", "deploy", "src") for p in (ROOT / d).rglob("*")
               if p.is_file() and p.suffix in (".md", ".py", ".yaml", ".txt", ".tpl", ".json"))]
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in roots
             for n, line in enumerate(p.read_text().splitlines(), 1) if CITATIONS.search(line)]
    assert not found, "\n".join(found)


def test_readme_schedule_example_places_its_pod() -> None:
    from hami.offline import load_objects, schedule

    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", readme, re.S)
    assert block is not None
    report = schedule(load_objects(block.group(1)))
    assert [(p["namespace"], p["name"], p["node"]) for p in report["pods"]] == [
        ("default", "slice", "gpu-1")]
