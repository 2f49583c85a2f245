"""The example Grafana dashboard (docs/grafana/lakestep.json), the Prometheus alert rules
(docs/prometheus/alerts.yml and their promtool unit tests) and docs/metrics.md, checked against
:data:`lakestep.serve.metrics.METRICS`: no Spark, no catalog.

* Every ``lakestep_*`` name a panel, a dashboard variable or a rule queries exists, with only the
  labels it has (``table`` on per-table metrics, ``job_id`` on per-job ones). ``job`` is
  Prometheus's scrape job (``job="lakestep"`` on every series), never lakestep's job id: no
  selector, grouping, legend or annotation of a ``lakestep_*`` metric uses it for that.
* Every metric is used by the dashboard or the rules, or listed in :data:`LEFT_OUT`.
* promtool (Prometheus's own checker, apt package ``prometheus``) parses the rules, runs their
  unit tests, parses every dashboard query as PromQL and checks the scrape config of
  docs/metrics.md. A machine without promtool fails these tests: scripts/ensure-services.sh
  installs it, as it installs Chromium for tests/cli/test_report.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml  # PyYAML: in the test extra through moto[server] (responses needs it)

from lakestep.serve.metrics import METRICS

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "lakestep.json"
ALERTS = ROOT / "docs" / "prometheus" / "alerts.yml"
ALERTS_TEST = ROOT / "docs" / "prometheus" / "alerts_test.yml"
DOC = ROOT / "docs" / "metrics.md"

#: Metrics neither the dashboard nor the rules use, on purpose: Unix times whose ``_age_seconds``
#: twin says the same on the catalog clock (Grafana and Prometheus measure ``time()`` on theirs).
LEFT_OUT = {
    "lakestep_last_seal_timestamp_seconds",
    "lakestep_table_last_commit_timestamp_seconds",
    "lakestep_job_last_batch_timestamp_seconds",
}

#: The alerts docs/metrics.md promises.
ALERT_NAMES = {"LakestepCatalogDown", "LakestepNoCoordinator", "LakestepNoSeal", "LakestepTableLagging",
               "LakestepJobStalled", "LakestepPublishingStalled", "LakestepPublishingFailing",
               "LakestepPublishingTableErrors"}

# A metric name in a query. METRICS' keys are the sample names Prometheus stores, so the
# counter's key carries its `_total` suffix, as queries must.
NAME = re.compile(r"(?<![A-Za-z0-9_:])lakestep_[A-Za-z0-9_:]*")
SELECTOR = re.compile(r"(?<![A-Za-z0-9_:])(lakestep_[A-Za-z0-9_:]*)\s*\{([^}]*)\}")
MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
VARIABLE = re.compile(r"\$\{?(\w+)\}?")
# Label lists of aggregations and vector matching: `by (...)`, `without (...)`, `on (...)`, ...
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    for p in doc["panels"]:
        yield p
        yield from p.get("panels", ())


def variable_queries() -> dict[str, tuple[str, str]]:
    """name: (series selector, label) of every query variable, a label_values(selector, label)."""
    out = {}
    for v in dashboard()["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q)
            assert m, f"variable {v['name']}: not label_values(selector, label): {q}"
            assert v["definition"] == q, f"variable {v['name']}: definition and query differ"
            out[v["name"]] = (m.group(1), m.group(2))
    return out


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, query) for every panel target and every query variable (its series selector)."""
    out = [(f"panel {p['title']!r}", t["expr"]) for p in panels(dashboard()) for t in p.get("targets", ())]
    out += [(f"variable {name!r}", selector) for name, (selector, _) in variable_queries().items()]
    return out


def rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def rule_queries() -> list[tuple[str, str]]:
    return [(f"alert {r['alert']}", r["expr"]) for r in rules()]


def names(query: str) -> set[str]:
    return set(NAME.findall(query))


def promql(query: str) -> str:
    """A dashboard query with Grafana's variables replaced: PromQL promtool can parse."""
    fixed = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
    return VARIABLE.sub(lambda m: fixed.get(m.group(1), ".*"), query)


# ------------------------------------------------------------------ without promtool

def test_the_dashboard_is_a_grafana_dashboard() -> None:
    doc = dashboard()
    assert doc["uid"] and doc["title"] and doc["schemaVersion"] >= 36
    shown = [p for p in panels(doc) if p["type"] != "row"]
    assert len(shown) >= 20 and all(p.get("targets") for p in shown)
    assert all(p["datasource"] == {"type": "prometheus", "uid": "${datasource}"} for p in shown)
    assert all(t["datasource"]["uid"] == "${datasource}" for p in shown for t in p["targets"])
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("table", "job"):
        assert variables[name]["type"] == "query" and variables[name]["definition"].startswith("label_values(")
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
    ids = [p["id"] for p in panels(doc)]
    assert len(ids) == len(set(ids))
    for p in shown:  # inside the 24-column grid, and no two panels overlap
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
    cells = [(x, y) for g in (p["gridPos"] for p in panels(doc))
             for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])]
    assert len(set(cells)) == len(cells), "panels overlap"
    titles = {p["title"] for p in shown}
    assert {"Coordinator", "Open epoch", "Last seal age"} <= titles
    exprs = [t["expr"] for p in shown for t in p["targets"]]
    assert any("rate(lakestep_job_batches_committed_total" in e and "[5m])" in e for e in exprs)


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_queries_name_only_metrics_that_exist(source: str) -> None:
    queries = dashboard_queries() if source == "dashboard" else rule_queries()
    unknown = {where: sorted(names(q) - METRICS.keys()) for where, q in queries if names(q) - METRICS.keys()}
    assert not unknown, f"names not in lakestep.serve.metrics.METRICS: {unknown}"
    if source == "dashboard":
        assert all(names(q) for _, q in queries), "a panel queries no lakestep metric"


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_selectors_use_only_the_labels_a_metric_has(source: str) -> None:
    """`table` exists on per-table metrics, `job_id` on per-job ones, `kind` on both; `instance`
    on every series (Prometheus's target label). No lakestep_* selector matches on `job`: on
    every series it is Prometheus's scrape job, not lakestep's job id (that is `job_id`)."""
    queries = dashboard_queries() if source == "dashboard" else rule_queries()
    wrong, on_job = [], []
    for where, q in queries:
        for name, matchers in SELECTOR.findall(q):
            allowed = {"instance"}
            if name.startswith("lakestep_table_"):
                allowed |= {"table", "kind"}
            elif name.startswith("lakestep_job_"):
                allowed |= {"job_id", "kind"}
            labels = MATCHER.findall(matchers)
            on_job += [(where, name) for label in labels if label == "job"]
            wrong += [(where, name, label) for label in labels if label not in allowed]
        if names(q):
            on_job += [(where, f"grouping ({g})") for g in GROUPING.findall(q)
                       if "job" in re.findall(r"\w+", g)]
    assert not on_job, f"`job` is the scrape job: select and group lakestep's job id as job_id: {on_job}"
    assert not wrong


def test_the_dashboard_selects_jobs_by_job_id() -> None:
    """The `job` variable lists job_id values; every per-job panel query filters on
    job_id=~"$job", and names its series and columns by job_id, never by the scrape job."""
    variables = variable_queries()
    assert variables["job"][1] == "job_id" and variables["table"][1] == "table"
    assert variables["instance"][1] == "instance"
    doc = dashboard()
    per_job = [p for p in panels(doc) if any("lakestep_job_" in t["expr"] for t in p.get("targets", ()))]
    assert per_job
    for p in per_job:
        for t in p["targets"]:
            assert 'job_id=~"$job"' in t["expr"], (p["title"], t["expr"])
            assert t["legendFormat"] in ("__auto", "{{job_id}}"), (p["title"], t["legendFormat"])
        for tr in p.get("transformations", ()):
            if tr["id"] == "organize":  # a table: the scrape job hidden, the job id shown first
                o = tr["options"]
                assert o["excludeByName"].get("job") is True, p["title"]
                assert o["indexByName"].get("job_id") == 0, p["title"]
    legends = [t.get("legendFormat", "") for p in panels(doc) for t in p.get("targets", ())]
    assert not [f for f in legends if re.search(r"\{\{\s*job\s*\}\}", f)]
    assert "honor_labels" not in json.dumps(doc)


def test_the_job_alert_names_the_job_by_job_id() -> None:
    """Annotations name lakestep's job as $labels.job_id; $labels.job is the scrape job."""
    for r in rules():
        text = " ".join(r["annotations"].values())
        assert not re.search(r"\$labels\.job\b(?!_)", text), r["alert"]
        if "lakestep_job_" in r["expr"]:
            assert "$labels.job_id" in r["annotations"]["summary"], r["alert"]
    assert "honor_labels" not in ALERTS.read_text() + ALERTS_TEST.read_text()


def test_the_unit_tests_feed_series_as_prometheus_scrapes_them() -> None:
    """Each lakestep_* input series has the labels a scrape gives it: Prometheus's
    job="lakestep" and instance, plus job_id on per-job metrics (table on per-table ones)."""
    doc = yaml.safe_load(ALERTS_TEST.read_text())
    series = [s["series"] for t in doc["tests"] for s in t["input_series"]]
    lakestep = [s for s in series if s.startswith("lakestep_")]
    assert lakestep
    for s in lakestep:
        m = re.fullmatch(r"(lakestep_\w+)\{(.*)\}", s)
        assert m, s
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        assert labels.get("job") == "lakestep" and labels.get("instance"), s
        if m.group(1).startswith("lakestep_job_"):
            assert labels.get("job_id") and set(labels) == {"job", "instance", "job_id", "kind"}, s
        elif m.group(1).startswith("lakestep_table_"):
            assert labels.get("table") and set(labels) == {"job", "instance", "table", "kind"}, s
        else:
            assert set(labels) == {"job", "instance"}, s


def test_the_alert_rules_are_complete() -> None:
    found = rules()
    assert {r["alert"] for r in found} == ALERT_NAMES
    for r in found:
        assert set(r) == {"alert", "expr", "for", "labels", "annotations"}, r["alert"]
        assert r["labels"]["severity"] in {"critical", "warning"}, r["alert"]
        assert r["annotations"]["summary"] and "threshold" in r["annotations"]["description"], r["alert"]
        assert re.fullmatch(r"\d+[smh]", r["for"]), r["alert"]
    by_name = {r["alert"]: r["expr"] for r in found}
    assert by_name["LakestepCatalogDown"].strip() == 'up{job="lakestep"} == 0'
    assert by_name["LakestepNoCoordinator"].strip() == "lakestep_coordinator_leader == 0"


def test_every_rule_has_a_unit_test_that_fires_it_and_one_that_does_not() -> None:
    doc = yaml.safe_load(ALERTS_TEST.read_text())
    assert doc["rule_files"] == [ALERTS.name]
    cases = [c for t in doc["tests"] for c in t["alert_rule_test"]]
    fires = {c["alertname"] for c in cases if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    assert fires == ALERT_NAMES and quiet == ALERT_NAMES


def test_every_metric_is_used_or_left_out_on_purpose() -> None:
    dash = set().union(*(names(q) for _, q in dashboard_queries()))
    alerts = set().union(*(names(q) for _, q in rule_queries()))
    assert LEFT_OUT <= METRICS.keys(), LEFT_OUT - METRICS.keys()
    assert not LEFT_OUT & (dash | alerts), f"used now, take them off LEFT_OUT: {LEFT_OUT & (dash | alerts)}"
    assert not METRICS.keys() - dash - alerts - LEFT_OUT, "in no panel and no rule: " + ", ".join(
        sorted(METRICS.keys() - dash - alerts - LEFT_OUT))


def test_the_metrics_page_lists_every_metric() -> None:
    """docs/metrics.md's table: one row per metric, with its type and labels; no other name."""
    text = DOC.read_text()
    rows = {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(
        r"^\| `(lakestep_\w+)` \| (\w+) \| ([^|]+) \|", text, re.MULTILINE)}
    assert rows.keys() == METRICS.keys()
    for name, (kind, labels) in rows.items():
        assert kind == METRICS[name][0], name
        want = ("`table`, `kind`" if name.startswith("lakestep_table_") else
                "`job_id`, `kind`" if name.startswith("lakestep_job_") else "-")
        assert labels.strip() == want, name
    assert names(text) <= METRICS.keys(), names(text) - METRICS.keys()
    assert "Measured: see benchmarks/serve.py --metrics" in text
    assert "honor_labels" not in text, "per-job metrics label their job job_id: no honor_labels needed"
    for f in (DASHBOARD, ALERTS, ALERTS_TEST):
        assert str(f.relative_to(ROOT)) in text


# --------------------------------------------------------------------- with promtool

@pytest.fixture(scope="module")
def promtool() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool is not installed: scripts/ensure-services.sh installs it (apt package prometheus; "
                    "make test runs it)")
    return binary


def run(*args: str) -> None:
    r = subprocess.run(args, check=False, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{' '.join(args)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"


def test_promtool_checks_the_rules(promtool: str) -> None:
    run(promtool, "check", "rules", str(ALERTS))


def test_promtool_runs_the_rules_unit_tests(promtool: str) -> None:
    run(promtool, "test", "rules", str(ALERTS_TEST))


def test_every_dashboard_query_is_promql(promtool: str, tmp_path: Path) -> None:
    """Each query (Grafana's variables replaced) as a recording rule: promtool parses it."""
    recorded = [{"record": f"lakestep_dashboard:query_{i}", "expr": promql(q)}
                for i, (_, q) in enumerate(dashboard_queries())]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recorded}]}))
    run(promtool, "check", "rules", str(path))


def test_the_scrape_config_on_the_metrics_page_is_valid(promtool: str, tmp_path: Path) -> None:
    """The prometheus.yml snippet of docs/metrics.md: valid, with the scrape job name the
    rules select (`up{job="lakestep"}`); per-job metrics carry job_id, so Prometheus's own `job`
    label needs no honor_labels."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.DOTALL)
    snippet = next(b for b in blocks if "scrape_configs:" in b)
    (job,) = yaml.safe_load(snippet)["scrape_configs"]
    assert job["job_name"] == "lakestep" and "honor_labels" not in job
    assert "credentials_file" in job["authorization"]
    path = tmp_path / "prometheus.yml"
    path.write_text(snippet)
    run(promtool, "check", "config", "--syntax-only", str(path))
