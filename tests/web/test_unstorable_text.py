"""Text the database refuses, at the HTTP API: a trigger whose payload
holds a lone surrogate answers 422 naming the field, never 5xx; the detail of a row whose
text is odd (a lone surrogate in a payload an older push wrote on SQLite, an error and logs
a handler wrote with one, characters beyond U+FFFF) answers 200, on the API and the page."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
from celery_outbox.states import Status
from celery_outbox.store import NewExecution
from tests.web.conftest import bearer

UNDECODABLE = b"\xff".decode("utf-8", "surrogateescape")  # '\udcff'


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str
    count: int = 0


def note_job(registry: JobRegistry) -> Any:
    @outbox_job(schema=Note, name="shop.note", record="all", registry=registry)
    def note(ctx: JobContext[Note]) -> None:
        ctx.log.warning("odd file %s", UNDECODABLE)
        raise OSError(f"cannot read {UNDECODABLE} {ctx.payload.text}")

    return note


@pytest.mark.parametrize(("payload", "field"), [
    ({"text": f"a{UNDECODABLE}"}, "payload.text"),
    ({"text": "ok", "count": f"1{UNDECODABLE}"}, "payload.count"),
    ({"text": "ok", f"extra{UNDECODABLE}": 1}, "payload"),  # pydantic names no key here
], ids=["value", "bad-int", "unknown-key"])
def test_a_trigger_with_a_lone_surrogate_answers_422_naming_the_field(
    client: TestClient, jobs: Any, registry: JobRegistry, payload: dict[str, Any],
    field: str,
) -> None:
    note_job(registry)
    body = json.dumps({"payload": payload})  # ASCII: the surrogate as its \\u escape
    r = client.post("/api/v1/jobs/shop.note/trigger", content=body,
                    headers={**bearer(), "Content-Type": "application/json"})
    assert r.status_code == 422, r.text[:300]
    assert [e["field"] for e in r.json()["errors"]] == [field], r.text[:300]


def test_the_detail_of_a_row_with_odd_text_answers_200(
    client: TestClient, jobs: Any, registry: JobRegistry, web_outbox: Outbox,
) -> None:
    note = note_job(registry)
    failed = note.push({"text": "🚀 \ufffd"})  # runs inline (eager): fails, its text odd
    ids = [failed]
    if web_outbox.store.dialect == "sqlite":
        # What a push stored before payloads were checked: a lone surrogate in JSON text.
        odd = NewExecution.create("shop.note", {"text": f"x{UNDECODABLE}"},
                                  datetime.now(timezone.utc), priority=2, max_attempts=1)
        web_outbox.store.insert_alone([odd])
        ids.append(odd.id)
    assert web_outbox.store.status_of(failed) == Status.FAILED.value
    for execution_id in ids:
        r = client.get(f"/api/v1/executions/{execution_id}", headers=bearer())
        assert r.status_code == 200, r.text[:300]
        body = r.json()
        assert UNDECODABLE not in r.text
        page = client.get(f"/executions/{execution_id}", headers=bearer())
        assert page.status_code == 200, page.text[:300]
        listing = client.get("/api/v1/executions", params={"job": "shop.note"},
                             headers=bearer())
        assert listing.status_code == 200, listing.text[:300]
    detail = client.get(f"/api/v1/executions/{failed}", headers=bearer()).json()
    assert detail["traceback"].startswith("OSError: cannot read \ufffd 🚀 \ufffd"), body
    assert any("odd file \ufffd" in e["message"] for e in detail["logs"])


@pytest.mark.parametrize("name", ["key", "tenant", "error"])
def test_a_filter_with_a_lone_surrogate_answers_400_naming_it(
    client: TestClient, jobs: Any, name: str,
) -> None:
    """A JSON body can carry one (a query string cannot: it is decoded with U+FFFD)."""
    body = json.dumps({name: f"a{UNDECODABLE}"})
    r = client.post("/api/v1/executions/bulk/cancel", content=body,
                    headers={**bearer(), "Content-Type": "application/json"})
    assert r.status_code in (400, 422) and name in r.json()["detail"], r.text[:300]
