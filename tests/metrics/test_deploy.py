"""The Grafana dashboard and the Prometheus alert rules shipped in ``deploy/``: every metric
they name is one the package exports, and promtool accepts them (the rules' own unit tests
included: each alert fires on the series that should raise it)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("prometheus_client")

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

from celery_outbox import metrics as prometheus
from tests.procs import ROOT

DEPLOY = Path(ROOT) / "deploy"
RULES = DEPLOY / "prometheus" / "celery_outbox_alerts.yml"
RULES_TEST = DEPLOY / "prometheus" / "celery_outbox_alerts_test.yml"
DASHBOARD = DEPLOY / "grafana" / "celery_outbox.json"
NAME = re.compile(r"\bcelery_outbox_[a-z_]+\b")


def _rule_exprs() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def _strings(value: Any, key: str) -> Iterator[str]:
    """Every string under ``key`` anywhere in ``value`` (a parsed JSON document)."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k == key and isinstance(v, str):
                yield v
            else:
                yield from _strings(v, key)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item, key)


def _dashboard_exprs() -> list[str]:
    document = json.loads(DASHBOARD.read_text())
    return [*_strings(document, "expr"), *_strings(document, "definition")]


def test_the_exported_names_are_the_modules_metrics() -> None:
    names: set[str] = set()
    collector = prometheus.TableCollector(_NoStore(), [], tenants=True)
    loop = prometheus.LoopCollector(lambda: ())
    for family in [*prometheus.EVENTS.collect(), *collector.describe(), *loop.describe()]:
        if isinstance(family, CounterMetricFamily) or family.type == "counter":
            names.add(family.name + "_total")
        elif isinstance(family, HistogramMetricFamily) or family.type == "histogram":
            names.update(family.name + s for s in ("", "_bucket", "_count", "_sum"))
        else:
            names.add(family.name)
    assert names == prometheus.exported_names()


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_metric_named_is_exported(source: str) -> None:
    exprs = _rule_exprs() if source == "rules" else _dashboard_exprs()
    used = {name for expr in exprs for name in NAME.findall(expr)}
    assert used, f"no celery_outbox metric found in the {source}"
    assert used - prometheus.exported_names() == set()
    if source == "dashboard":  # it shows every metric but the per-tenant rows
        histograms = {"celery_outbox_handler_duration_seconds", "celery_outbox_wait_seconds"}
        wanted = {n for n in prometheus.exported_names()
                  if not n.startswith(tuple(histograms))} - {"celery_outbox_tenant_executions"}
        wanted |= {h + "_bucket" for h in histograms}
        assert wanted - used == set()


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        message = "promtool is not installed (Debian: apt-get install prometheus)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; .ci/run installs it (CI is set: must not skip)")
        pytest.skip(message)
    return found


def test_promtool_checks_and_tests_the_rules() -> None:
    promtool = _promtool()
    for args in (["check", "rules", RULES.name], ["test", "rules", RULES_TEST.name]):
        done = subprocess.run([promtool, *args], cwd=RULES.parent, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_parses_the_dashboards_queries(tmp_path: Path) -> None:
    """Each panel's query as a recording rule (Grafana's ``$job`` as ``.*``): promtool
    parses its PromQL."""
    promtool = _promtool()
    exprs = [e.replace("$job", ".*") for e in _strings(json.loads(DASHBOARD.read_text()),
                                                         "expr")]
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": expr} for i, expr in enumerate(exprs)]}]}
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump(rules))
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


class _NoStore:
    t: Any = None
    dialect = "postgresql"
    executor: Any = None
