"""The core installs and runs without the ``metrics`` extra: ``prometheus_client`` is imported
by :mod:`celery_outbox.metrics` alone, and that module only when metrics are asked for.

Each check runs in a fresh interpreter in which ``prometheus_client`` cannot be imported (a
finder refuses it), as in an environment without the extra.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.procs import ROOT

ABSENT = """
import sys
class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if name == "prometheus_client" or name.startswith("prometheus_client."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Refuse())

def loaded():
    return sorted(m for m in sys.modules
                  if m.startswith(("prometheus", "celery_outbox.metrics")))
"""


def _run(code: str, tmp_path: Path) -> dict[str, object]:
    out = tmp_path / "out.json"
    script = f"{ABSENT}\n{code}\nimport json\njson.dump(result, open({str(out)!r}, 'w'))\n"
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=120)
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def test_import_push_and_run_without_prometheus_client(tmp_path: Path) -> None:
    code = f"""
import celery_outbox
from celery import Celery
from pydantic import BaseModel
from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job

after_import = loaded()
app = Celery("optional", broker="memory://")
app.conf.task_always_eager = True
registry = JobRegistry()
outbox = Outbox(app, database_url="sqlite:///{tmp_path / 'outbox.db'}", registry=registry)
outbox.create_schema()
ran = []

class Item(BaseModel):
    n: int

@outbox_job(name="optional.job", schema=Item, record="all", registry=registry)
def job(ctx: JobContext[Item]) -> None:
    ran.append(ctx.payload.n)

execution = job.push({{"n": 1}})
row = outbox.store.get(execution)
try:
    Outbox(app, database_url="sqlite:///{tmp_path / 'outbox.db'}", registry=registry,
           metrics=True)
    refused = ""
except celery_outbox.ConfigurationError as exc:
    refused = str(exc)
result = {{
    "after_import": after_import, "ran": ran, "status": row["status"],
    "loaded": loaded(),
    "refused": refused,
}}
"""
    result = _run(code, tmp_path)
    assert result["after_import"] == []
    assert result["ran"] == [1]
    assert result["status"] == "succeeded"
    assert result["loaded"] == []  # a push, a run and a refused metrics=True imported neither
    assert "pip install 'celery-outbox[metrics]'" in str(result["refused"])


def test_the_web_app_without_metrics_imports_no_prometheus_client(tmp_path: Path) -> None:
    code = f"""
from celery import Celery
from celery_outbox import Outbox
from celery_outbox.web import create_app
from fastapi.testclient import TestClient

app = Celery("optional", broker="memory://")
outbox = Outbox(app, database_url="sqlite:///{tmp_path / 'outbox.db'}")
outbox.create_schema()
client = TestClient(create_app(outbox, auth=None), base_url="http://127.0.0.1",
                    client=("127.0.0.1", 5000))
result = {{
    "metrics": client.get("/metrics").status_code,
    "jobs": client.get("/api/v1/jobs").status_code,
    "loaded": loaded(),
}}
"""
    result = _run(code, tmp_path)
    assert result == {"metrics": 404, "jobs": 200, "loaded": []}


def test_prometheus_client_is_imported_in_the_metrics_package_alone() -> None:
    package = Path(ROOT) / "celery_outbox"
    statement = re.compile(r"^\s*(from|import)\s+prometheus_client\b", re.MULTILINE)
    importing = sorted(str(path.relative_to(package)) for path in package.rglob("*.py")
                       if statement.search(path.read_text())
                       and path.relative_to(package).parts[0] != "metrics")
    assert importing == []
