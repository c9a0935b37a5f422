"""The dashboard and the JSON API show an encrypted job's payload as "encrypted" unless the
principal may see it (``show_encrypted_payloads``): never the stored token, nor the
plaintext, to one who may not; decrypted for one who may. A retry from the API keeps the new
execution's payload encrypted at rest."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel
from sqlalchemy import text

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
from celery_outbox.encryption import ENV_VAR, generate_key
from celery_outbox.web import Auth, Principal, Token, User, create_app, hash_secret
from tests.integration.conftest import MakeOutbox

SECRET = "4111-1111-1111-1111"
KEY = generate_key()


class Card(BaseModel):
    number: str


@pytest.fixture
def box(db_url: str, make_outbox: MakeOutbox, monkeypatch: pytest.MonkeyPatch) -> Outbox:
    monkeypatch.delenv(ENV_VAR, raising=False)
    registry = JobRegistry()

    @outbox_job(schema=Card, name="pay.charge", encrypted=True, registry=registry)
    def charge(ctx: JobContext[Card]) -> None:
        raise ValueError("declined")

    return make_outbox(db_url, registry, encryption_keys=[KEY])


@pytest.fixture
def client(box: Outbox) -> Iterator[TestClient]:
    auth = Auth(
        tokens=[Token("ops", token_hash=hash_secret("ops-token", kind="token"),
                      access="operate"),
                Token("auditor", token_hash=hash_secret("audit-token", kind="token"),
                      show_encrypted_payloads=True)],
        users=[User("ada", password_hash=hash_secret("pw"), show_encrypted_payloads=True)],
    )
    with TestClient(create_app(box, auth=auth, cache_for=timedelta(0))) as c:
        yield c


def failed(box: Outbox) -> str:
    """A failed execution of the encrypted job, its id."""
    new = box.push_many(box.registry.get("pay.charge"), [{"number": SECRET}])[0]
    box.run_now("pay.charge", [new])
    return str(new)


def test_the_payload_is_masked_unless_the_principal_may_see_it(
    box: Outbox, client: TestClient,
) -> None:
    execution_id = failed(box)
    ops = {"Authorization": "Bearer ops-token"}
    masked = client.get(f"/api/v1/executions/{execution_id}", headers=ops)
    assert masked.status_code == 200
    assert masked.json()["payload"] == "encrypted"
    assert masked.json()["payload_encrypted"] is True
    assert SECRET not in masked.text and "$encrypted" not in masked.text
    page = client.get(f"/executions/{execution_id}", headers=ops)
    assert page.status_code == 200
    assert SECRET not in page.text and "$encrypted" not in page.text
    assert "(stored encrypted)" in page.text
    shown = client.get(f"/api/v1/executions/{execution_id}",
                       headers={"Authorization": "Bearer audit-token"})
    assert shown.json()["payload"] == {"number": SECRET}
    page = client.get(f"/executions/{execution_id}", auth=("ada", "pw"))
    assert SECRET in page.text
    # a retry from the API: the new execution is stored encrypted too
    retried = client.post(f"/api/v1/executions/{execution_id}/retry", headers=ops)
    assert retried.status_code == 201, retried.text
    new_id = retried.json()["new_execution_id"]
    column = "payload::text" if box.engine.dialect.name == "postgresql" else "payload"
    with box.engine.connect() as conn:
        raw = conn.execute(text(f"SELECT {column} FROM {box.store.t.name} WHERE id = :i"),
                           {"i": new_id if box.engine.dialect.name == "postgresql"
                            else new_id.replace("-", "")}).scalar_one()
    assert "$encrypted" in raw and SECRET not in raw


def test_principal_flag_is_checked() -> None:
    assert Principal("x").show_encrypted_payloads is False
    with pytest.raises(ValueError, match="show_encrypted_payloads"):
        Principal("x", show_encrypted_payloads="yes")  # type: ignore[arg-type]
