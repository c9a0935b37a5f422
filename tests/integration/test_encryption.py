"""Encrypted payloads (``@outbox_job(encrypted=True)``), on SQLite and PostgreSQL.

The payload column (read with plain SQL) holds an envelope and no plaintext, whatever the
push path (push, push_many, apush, trigger, eager mode, the admin's retry); the worker
decrypts before the job's schema validates; a rotation to ``[B, A]`` keeps rows of ``A``
readable and ``rotate_keys`` moves them to ``B`` (then ``[B]`` alone opens them, a second run
rewrites nothing); a worker without the key retries with backoff (a worker with it runs the row), a
payload no key opens fails once its attempts are spent, with a clear error; no key refuses
the push before anything is written; the admin's and the dashboard's reads show
``"encrypted"`` unless asked to decrypt; ``celery_outbox.testing`` compares decrypted.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel
from sqlalchemy import func, select, text

from celery_outbox import (
    JobContext,
    JobRegistry,
    Outbox,
    OutboxJob,
    RetryPolicy,
    outbox_job,
)
from celery_outbox.admin.keys import rotate_keys
from celery_outbox.dashboard import Dashboard
from celery_outbox.encryption import ENV_VAR, MASK, generate_key
from celery_outbox.errors import ConfigurationError
from celery_outbox.testing import assert_pushed, pushed
from tests.integration.conftest import MakeOutbox
from tests.integration.fakes import RecordingDispatcher

SECRET = "4111-1111-1111-1111"
KEY_A, KEY_B = generate_key(), generate_key()


class Card(BaseModel):
    holder: str
    number: str


@pytest.fixture(autouse=True)
def _no_env_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)


@pytest.fixture
def seen() -> list[Any]:
    return []


@pytest.fixture
def charge(registry: JobRegistry, seen: list[Any]) -> OutboxJob[Card]:
    @outbox_job(schema=Card, name="pay.charge", encrypted=True, registry=registry)
    def handler(ctx: JobContext[Card]) -> None:
        seen.append(ctx.payload)

    return handler


@pytest.fixture
def refund(registry: JobRegistry) -> OutboxJob[Card]:
    @outbox_job(schema=Card, name="pay.refund", encrypted=True, registry=registry)
    def handler(ctx: JobContext[Card]) -> None:
        raise ValueError("declined")

    return handler


def raw_payloads(box: Outbox) -> dict[UUID, str]:
    """Each row's payload column as the database holds it, read with plain SQL."""
    column = "payload::text" if box.engine.dialect.name == "postgresql" else "payload"
    t = box.store.t
    with box.engine.connect() as conn:
        found = conn.execute(text(f"SELECT id, {column} FROM {t.name}")).all()
    return {UUID(str(i)) if not isinstance(i, UUID) else i: str(p) for i, p in found}


def count_rows(box: Outbox) -> int:
    with box.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(box.store.t)).scalar_one())


def card(n: int = 0) -> dict[str, str]:
    return {"holder": f"Ada {n}", "number": SECRET}


def test_every_push_path_stores_an_envelope_and_the_worker_decrypts(
    db_url: str, registry: JobRegistry, charge: OutboxJob[Card], seen: list[Any],
    recording: RecordingDispatcher, make_outbox: MakeOutbox,
) -> None:
    box = make_outbox(db_url, registry, recording, encryption_keys=[KEY_A])
    ids = [charge.push(card(0)), *charge.push_many([card(1), Card(**card(2))]),
           asyncio.run(charge.apush(card(3))), charge.trigger(card(4))]
    ids.append(box.admin.trigger("pay.charge", card(5)))
    raw = raw_payloads(box)
    assert set(raw) == set(ids)
    for value in raw.values():
        assert SECRET not in value and "Ada" not in value
        assert "$encrypted" in value
    # celery_outbox.testing compares the decrypted payloads
    assert_pushed(charge, payload=card(3))
    rows = pushed(charge)
    assert all(r.encrypted for r in rows)
    assert sorted(r.payload["holder"] for r in rows) == [f"Ada {n}" for n in range(6)]
    result = box.run_now(charge.name, ids)
    assert result.succeeded == 6
    assert sorted(p.holder for p in seen) == [f"Ada {n}" for n in range(6)]
    assert all(p.number == SECRET for p in seen)


def test_eager_mode_runs_an_encrypted_job(
    db_url: str, registry: JobRegistry, charge: OutboxJob[Card], seen: list[Any],
    make_outbox: MakeOutbox,
) -> None:
    box = make_outbox(db_url, registry, eager=True, encryption_keys=KEY_A)
    charge.push(card(9))
    box.flush()
    assert [p.holder for p in seen] == ["Ada 9"]


def test_no_key_refuses_the_push_naming_the_setting_and_writes_nothing(
    db_url: str, registry: JobRegistry, charge: OutboxJob[Card],
    recording: RecordingDispatcher, make_outbox: MakeOutbox,
) -> None:
    box = make_outbox(db_url, registry, recording)
    for push in (lambda: charge.push(card()), lambda: charge.push_many([card(), card(1)]),
                 lambda: asyncio.run(charge.apush(card()))):
        with pytest.raises(ConfigurationError, match=f"encryption_keys.*{ENV_VAR}") as caught:
            push()
        assert caught.value.field == "encryption_keys"
    assert count_rows(box) == 0
    assert recording.ids == []


def test_keys_from_the_environment(
    db_url: str, registry: JobRegistry, charge: OutboxJob[Card], seen: list[Any],
    recording: RecordingDispatcher, make_outbox: MakeOutbox, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_VAR, f" {KEY_B} , {KEY_A}")
    box = make_outbox(db_url, registry, recording)
    execution_id = charge.push(card(1))
    assert SECRET not in raw_payloads(box)[execution_id]
    assert box.run_now(charge.name, [execution_id]).succeeded == 1
    assert seen[0].number == SECRET


def test_rotation_keeps_old_rows_readable_and_rotate_keys_moves_them_to_the_new_key(
    db_url: str, registry: JobRegistry, charge: OutboxJob[Card], seen: list[Any],
    recording: RecordingDispatcher, make_outbox: MakeOutbox,
) -> None:
    old = make_outbox(db_url, registry, recording, encryption_keys=[KEY_A])
    table = old.config.table_name
    under_a = [charge.push(card(n)) for n in range(5)]
    rotated = make_outbox(db_url, registry, recording, encryption_keys=[KEY_B, KEY_A],
                          table_name=table)
    under_b = charge.push(card(7))  # the new key encrypts
    assert rotated.run_now(charge.name, [under_a[0]]).succeeded == 1  # the old key decrypts
    done = rotate_keys(rotated.store, registry, rotated.keyring, batch_size=2)
    assert (done.rotated, done.current, done.undecryptable, done.scanned) == (4, 1, 0, 5)
    assert done.batches == 3  # bounded: 2 + 2 + 1
    again = rotate_keys(rotated.store, registry, rotated.keyring, batch_size=2)
    assert (again.rotated, again.current) == (0, 5)  # idempotent
    only_b = make_outbox(db_url, registry, recording, encryption_keys=[KEY_B],
                         table_name=table)
    result = only_b.run_now(charge.name, [*under_a[1:], under_b])
    assert result.succeeded == 5
    assert sorted(p.holder for p in seen) == sorted(f"Ada {n}" for n in (0, 1, 2, 3, 4, 7))


def test_a_worker_without_the_newest_key_retries_and_a_worker_with_it_runs_it(
    db_url: str, registry: JobRegistry, seen: list[Any],
    recording: RecordingDispatcher, make_outbox: MakeOutbox,
) -> None:
    """Keys roll to workers first: a worker rolled out late (the pushers already encrypt
    with the newest key it lacks) retries the execution with the policy's backoff, the
    work kept, and a worker holding the key runs it."""
    @outbox_job(schema=Card, name="pay.late", encrypted=True, registry=registry,
                retry=RetryPolicy(retries=2, backoff=timedelta(0), jitter=False))
    def late(ctx: JobContext[Card]) -> None:
        seen.append(ctx.payload)

    pusher = make_outbox(db_url, registry, recording, encryption_keys=[KEY_B, KEY_A])
    execution_id = late.push(card())
    behind = make_outbox(db_url, registry, recording, encryption_keys=[KEY_A],
                         table_name=pusher.config.table_name)
    result = behind.run_now(late.name, [execution_id])
    assert (result.claimed, result.retried, result.failed) == (1, 1, 0)
    assert seen == []
    detail = behind.admin.get_execution(execution_id)
    assert detail.status == "scheduled" and detail.attempt == 1
    assert detail.error is not None and "cannot decrypt the payload" in detail.error
    assert SECRET not in detail.error
    # rotate-keys with the late worker's keys reports it and leaves it
    done = rotate_keys(behind.store, registry, behind.keyring)
    assert (done.undecryptable, done.rotated) == (1, 0)
    rolled = make_outbox(db_url, registry, recording, encryption_keys=[KEY_B, KEY_A],
                         table_name=pusher.config.table_name)
    assert rolled.run_now(late.name, [execution_id]).succeeded == 1
    assert [p.number for p in seen] == [SECRET]


def test_a_payload_no_key_opens_fails_once_its_attempts_are_spent(
    db_url: str, registry: JobRegistry, seen: list[Any],
    recording: RecordingDispatcher, make_outbox: MakeOutbox,
) -> None:
    @outbox_job(schema=Card, name="pay.lost", encrypted=True, registry=registry,
                retry=RetryPolicy(retries=1, backoff=timedelta(0), jitter=False))
    def lost(ctx: JobContext[Card]) -> None:
        seen.append(ctx.payload)

    box = make_outbox(db_url, registry, recording, encryption_keys=[KEY_A])
    execution_id = lost.push(card())
    other = make_outbox(db_url, registry, recording, encryption_keys=[KEY_B],
                        table_name=box.config.table_name)
    assert other.run_now(lost.name, [execution_id]).retried == 1
    result = other.run_now(lost.name, [execution_id])
    assert (result.claimed, result.failed) == (1, 1)
    assert seen == []
    detail = other.admin.get_execution(execution_id)
    assert detail.status == "failed" and detail.attempt == 2
    assert detail.traceback is not None and "cannot decrypt the payload" in detail.traceback
    assert SECRET not in detail.traceback


def test_reads_show_encrypted_unless_asked_and_the_retry_stays_encrypted(
    db_url: str, registry: JobRegistry, refund: OutboxJob[Card],
    recording: RecordingDispatcher, make_outbox: MakeOutbox,
) -> None:
    box = make_outbox(db_url, registry, recording, encryption_keys=[KEY_A])
    execution_id = refund.push(card(1))
    box.run_now(refund.name, [execution_id])
    detail = box.admin.get_execution(execution_id)
    assert (detail.payload, detail.payload_encrypted) == (MASK, True)
    assert SECRET not in str(detail.to_dict())
    shown = box.admin.get_execution(execution_id, show_encrypted=True)
    assert shown.payload == card(1) and shown.payload_encrypted
    board = Dashboard(box.admin)
    assert board.execution(execution_id).payload == MASK
    assert board.execution(execution_id, show_encrypted=True).payload == card(1)
    # a retry copies the envelope: no key needed to retry, still encrypted at rest
    keyless = make_outbox(db_url, registry, recording, table_name=box.config.table_name)
    new_id = keyless.admin.retry(execution_id)
    assert new_id != execution_id
    assert raw_payloads(box)[new_id] == raw_payloads(box)[execution_id]
    shown = box.admin.get_execution(new_id, show_encrypted=True)
    assert shown.payload == card(1) and shown.retry_of == execution_id


def test_a_cron_job_marked_encrypted_ticks_with_no_payload(
    db_url: str, registry: JobRegistry, recording: RecordingDispatcher,
    make_outbox: MakeOutbox,
) -> None:
    ran: list[Any] = []

    @outbox_job(cron="0 3 * * *", name="pay.nightly", encrypted=True, registry=registry)
    def nightly(ctx: JobContext[None]) -> None:
        ran.append(ctx.payload)

    box = make_outbox(db_url, registry, recording)  # no key: nothing to encrypt
    execution_id = nightly.trigger()
    assert execution_id is not None
    assert box.run_now(nightly.name, [execution_id]).succeeded == 1
    assert ran == [None]


def test_a_bad_key_is_refused_without_showing_it(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
) -> None:
    with pytest.raises(ConfigurationError, match="encryption_keys") as caught:
        make_outbox(db_url, registry, encryption_keys=[KEY_A, "not-a-key-at-all"])
    assert "not-a-key" not in str(caught.value) and KEY_A not in str(caught.value)
    box = make_outbox(db_url, registry, encryption_keys=f"{KEY_A},{KEY_B}")
    assert len(box.keyring.keys) == 2
    assert KEY_A not in repr(box.config) and KEY_A not in repr(box.keyring)


def test_an_encrypted_job_without_schema_validation_leaks_no_values(
    db_url: str, registry: JobRegistry, recording: RecordingDispatcher,
    make_outbox: MakeOutbox,
) -> None:
    """A stored payload the job's schema no longer takes fails without its values in the
    error (the error is stored in clear)."""

    class Strict(BaseModel):
        holder: str
        number: int

    @outbox_job(schema=Card, name="pay.changing", encrypted=True, registry=registry)
    def before(ctx: JobContext[Card]) -> None:
        return None

    box = make_outbox(db_url, registry, recording, encryption_keys=[KEY_A])
    execution_id = before.push(card())

    @outbox_job(schema=Strict, name="pay.changing", encrypted=True, registry=JobRegistry())
    def after(ctx: JobContext[Strict]) -> None:
        return None

    registry.jobs["pay.changing"] = after.spec
    assert box.run_now("pay.changing", [execution_id]).failed == 1
    error = box.admin.get_execution(execution_id).traceback or ""
    assert "number" in error and SECRET not in error and "4111" not in error


def test_the_cli_shows_encrypted_unless_asked_and_rotates_keys(
    db_url: str, registry: JobRegistry, refund: OutboxJob[Card],
    recording: RecordingDispatcher, make_outbox: MakeOutbox,
) -> None:
    from types import SimpleNamespace

    from click.testing import CliRunner

    from celery_outbox.cli import outbox as outbox_group

    old = make_outbox(db_url, registry, recording, encryption_keys=[KEY_A])
    execution_id = refund.push(card(1))
    box = make_outbox(db_url, registry, recording, encryption_keys=[KEY_B, KEY_A],
                      table_name=old.config.table_name)

    def invoke(*args: str) -> Any:
        return CliRunner().invoke(outbox_group, list(args), obj=SimpleNamespace(app=box.app))

    masked = invoke("show", str(execution_id), "--json")
    assert masked.exit_code == 0, masked.output
    data = json.loads(masked.output)["data"]
    assert (data["payload"], data["payload_encrypted"]) == (MASK, True)
    assert SECRET not in masked.output and "$encrypted" not in masked.output
    shown = invoke("show", str(execution_id), "--show-encrypted", "--json")
    assert json.loads(shown.output)["data"]["payload"] == card(1)
    rotated = invoke("rotate-keys", "--batch-rows", "1", "--job", "refund", "--json")
    assert rotated.exit_code == 0, rotated.output
    counts = json.loads(rotated.output)["data"]
    assert (counts["rotated"], counts["jobs"]) == (1, ["pay.refund"])
    again = invoke("rotate-keys")
    assert again.exit_code == 0 and "0 re-encrypted, 1 already under the newest key" \
        in again.output
    not_encrypted = invoke("rotate-keys", "--job", "nope")
    assert not_encrypted.exit_code != 0


def test_a_job_no_longer_encrypted_still_reads_and_retries_its_encrypted_rows(
    db_url: str, registry: JobRegistry, refund: OutboxJob[Card],
    recording: RecordingDispatcher, make_outbox: MakeOutbox,
) -> None:
    box = make_outbox(db_url, registry, recording, encryption_keys=[KEY_A])
    execution_id = refund.push(card(2))
    seen_plain: list[Any] = []

    @outbox_job(schema=Card, name="pay.refund", registry=JobRegistry())
    def plain(ctx: JobContext[Card]) -> None:
        seen_plain.append(ctx.payload)
        raise ValueError("still declined")

    registry.jobs["pay.refund"] = plain.spec  # the same job, declared without encrypted=True
    assert box.run_now("pay.refund", [execution_id]).failed == 1
    assert [p.number for p in seen_plain] == [SECRET]  # the old row's envelope was opened
    new_id = box.admin.retry(execution_id)
    assert SECRET in raw_payloads(box)[new_id]  # pushed again as the job now stores it
    assert box.admin.get_execution(new_id).payload == card(2)


def test_declaring_an_encrypted_job_without_a_key_warns(
    db_url: str, registry: JobRegistry, charge: OutboxJob[Card], make_outbox: MakeOutbox,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="celery_outbox.outbox"):
        make_outbox(db_url, registry)
    assert any("pay.charge is encrypted=True but no encryption key" in r.getMessage()
               for r in caplog.records)
