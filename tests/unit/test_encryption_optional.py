"""The core installs and runs without the ``encryption`` extra: ``cryptography`` is imported
only when a payload is encrypted or decrypted.

The check runs in a fresh interpreter in which ``cryptography`` cannot be imported (a finder
refuses it), as in an environment without the extra: ``import celery_outbox``, an Outbox with
encryption keys configured, a push and a run of a job that is not encrypted all work and
import nothing of it; declaring ``encrypted=True`` there fails at once naming the extra.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.procs import ROOT

ABSENT = """
import sys
class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if name == "cryptography" or name.startswith("cryptography."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Refuse())

def loaded():
    return sorted(m for m in sys.modules if m.startswith("cryptography"))
"""


def test_import_push_and_run_without_cryptography(tmp_path: Path) -> None:
    code = f"""
import celery_outbox
from celery import Celery
from pydantic import BaseModel
from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
from celery_outbox.encryption import generate_key

after_import = loaded()
app = Celery("optional", broker="memory://")
app.conf.task_always_eager = True
registry = JobRegistry()
outbox = Outbox(app, database_url="sqlite:///{tmp_path / 'outbox.db'}", registry=registry,
                encryption_keys=[generate_key()])
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
    @outbox_job(name="optional.secret", schema=Item, encrypted=True, registry=registry)
    def secret(ctx: JobContext[Item]) -> None:
        pass
    refused = ""
except celery_outbox.ConfigurationError as exc:
    refused = str(exc)
result = {{"after_import": after_import, "ran": ran, "status": row["status"],
           "payload": row["payload"], "loaded": loaded(), "refused": refused}}
"""
    out = tmp_path / "out.json"
    script = f"{ABSENT}\n{code}\nimport json\njson.dump(result, open({str(out)!r}, 'w'))\n"
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=120)
    result = json.loads(out.read_text())
    assert result["after_import"] == []
    assert result["ran"] == [1]
    assert result["status"] == "succeeded"
    assert result["payload"] == {"n": 1}
    assert result["loaded"] == []
    assert "encrypted" in result["refused"] and "celery-outbox[encryption]" in result["refused"]
