"""The Grafana dashboard queries only metrics the operator exports, so it cannot drift from the code: every
PromQL expression and variable query in charts/dtjob/dashboards/dtjob.json is checked against the names the
operator's registry exposes."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from dtjob import metrics

from tests.tools import REPO

DASHBOARD = REPO / "charts" / "dtjob" / "dashboards" / "dtjob.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
            "group_right", "inf", "nan"}  # fmt: skip
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
IDENTIFIER = re.compile(r"(?<![\w$:.])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()")
LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*\w+\s*\)\s*$")


def exported_names() -> set[str]:
    """Every sample name /metrics can carry, from the registry's families (also those with no sample yet)."""
    names: set[str] = set()
    for family in metrics.REGISTRY.collect():
        suffixes = SUFFIXES.get(family.type, ("",))
        names.update(family.name + suffix for suffix in suffixes)
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: what is left once strings, label matchers, ranges,
    grouping clauses, functions and keywords are taken out."""
    match = LABEL_VALUES.match(expr)
    if match:
        expr = match.group(1)
    expr = STRING.sub(" ", expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = GROUPING.sub(" ", expr)
    return {name for name in IDENTIFIER.findall(expr) if name.lower() not in KEYWORDS}


def queries(node: Any) -> Iterator[str]:
    """Every panel target's expr and every variable's query, anywhere in the dashboard."""
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, str) and (
                key == "expr" or (key == "query" and node.get("type") != "datasource")
            ):
                yield value
            elif key == "query" and isinstance(value, dict) and isinstance(value.get("query"), str):
                yield value["query"]
            else:
                yield from queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from queries(item)


def test_the_checker_finds_metric_names_and_only_them() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, verb) (rate(dtjob_kube_api_request_duration_seconds_bucket'
        '{verb=~"get|list", resource!="x"}[$__rate_interval]))) / on(instance) group_left() up offset 5m'
        ' and dtjob_jobs{phase="Running"} > bool 0'
    )  # fmt: skip
    assert metric_names(expr) == {"dtjob_kube_api_request_duration_seconds_bucket", "up", "dtjob_jobs"}
    assert metric_names('label_values(dtjob_training_step{namespace=~"$namespace"}, job_name)') == {
        "dtjob_training_step"
    }
    assert metric_names("sum(dtjob_process_resident_memory_bytes) / 2^30") == {
        "dtjob_process_resident_memory_bytes"
    }
    assert metric_names("rate(dtjob_reconcile_total[5m])") - exported_names() == {"dtjob_reconcile_total"}


def test_every_dashboard_query_uses_only_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = exported_names()
    found = list(queries(dashboard))
    assert len(found) >= 20
    used: set[str] = set()
    for expr in found:
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        assert names <= exported, (
            f"{expr!r} uses {sorted(names - exported)}, which the operator does not export"
        )
        used |= names
    # Every metric of the operator's own appears on the dashboard (histograms through one of their series).
    families = {f.name for f in metrics.REGISTRY.collect() if f.name.startswith("dtjob_")}
    process = {f for f in families if f.startswith("dtjob_process_")}
    shown = {f for f in families if any(name.startswith(f) for name in used)}
    assert families - process - shown == set()


def test_panels_do_not_overlap_and_ids_are_unique() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        mine = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                for y in range(grid["y"], grid["y"] + grid["h"])}  # fmt: skip
        assert not cells & mine, f"panel {panel['title']!r} overlaps another"
        cells |= mine
