"""Property-based fuzzing of the JSON API from its own OpenAPI document (schemathesis).

Every operation the document lists, on SQLite and on PostgreSQL, through schemathesis's own
engine: its phases (the document's examples; coverage: each parameter's boundaries, each
one missing or of another type, undeclared methods; fuzzing: valid and invalid requests;
stateful: chains of calls following the links it infers, e.g. a job name read from
``GET /jobs`` triggered) and every check it has, so no answer is a 5xx or breaks the
document (status codes, content types, bodies, declared headers such as ``Allow`` on a 405
and ``WWW-Authenticate`` on a 401), invalid input is refused with a 4xx, valid input is
accepted, authentication is enforced (each request replayed without and with wrong
credentials) and nothing answers in more than :data:`MAX_RESPONSE_SECONDS`.

Bounded and repeatable in the default suite (a fixed seed, :data:`EXAMPLES` per operation
and phase, as the operator token); ``OUTBOX_TEST_LONG=1`` runs :data:`LONG_EXAMPLES`, and
again as one tenant's user with each object it reads replayed as another tenant's.
"""

from __future__ import annotations

import base64
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.core.result import Err
from schemathesis.engine import events, from_schema

from celery_outbox import Outbox, OutboxJob
from celery_outbox.web import Auth, create_app
from tests.conftest import LONG, variants
from tests.web.conftest import PASSWORDS, bearer

EXAMPLES = 10
"""Requests per operation and phase in the default suite."""
LONG_EXAMPLES = 150
"""... under ``OUTBOX_TEST_LONG=1``."""
MAX_RESPONSE_SECONDS = 10.0
"""Generous: the machine running the suite is shared; a hang is what it catches."""
KNOWN = {
    "GET /api/v1/me", "GET /api/v1/jobs", "POST /api/v1/jobs/{job_name}/trigger",
    "GET /api/v1/executions", "GET /api/v1/executions/{execution_id}",
    "POST /api/v1/executions/{execution_id}/retry",
    "POST /api/v1/executions/{execution_id}/cancel",
    "POST /api/v1/executions/bulk/{action}", "GET /api/v1/failures",
}
"""Operations the document has at least (others are added as the API grows: each is fuzzed
as it comes)."""
READS = ("GET /api/v1/me", "GET /api/v1/jobs", "GET /api/v1/executions", "GET /api/v1/failures")
"""Reads some request of which must be answered 200 (the fuzzing got past validation)."""
POSITIVE = ["2xx", "3xx", "401", "403", "404", "409", "429"]
SEMANTIC = {
    # A cursor is opaque: only one this API returned is valid (any other: 400 naming
    # cursor); the payload filter is a JSON object as text (422) and PostgreSQL's (400 on
    # SQLite). The document's types cannot say either.
    "GET /api/v1/executions": ["400", "422"],
    # The payload is validated by the named job's own schema (a cron job takes none): the
    # one operation for every job cannot declare each job's schema.
    "POST /api/v1/jobs/{job_name}/trigger": ["400", "422"],
}
"""Operations whose schema-valid requests may still be refused, and with what (the check
``positive_data_acceptance``): each refusal names its field, which the API tests check."""


def basic(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()


def config(examples: int, tenants: Path | None) -> SchemathesisConfig:
    """Every phase and every check of the installed schemathesis, deterministic; as the
    operator token, or (``tenants``: a Web Fuzzing Commons file naming two tenants'
    users) as ``acme-ops``, each object it reads replayed as ``globex-ops`` (the check
    ``object_level_authorization``)."""
    operations = [{"include-name": label, "checks": {"positive_data_acceptance": {
        "expected-statuses": POSITIVE + codes}}} for label, codes in SEMANTIC.items()]
    who: dict[str, Any] = {"headers": bearer()}
    if tenants is not None:
        tenants.write_text(json.dumps({"auth": [
            {"name": name, "fixedHeaders": [{"name": "Authorization", "value": basic(user)}]}
            for name, user in (("acme", "acme-ops"), ("globex", "globex-ops"))]}))
        who = {"auth": {"wfc": {"path": str(tenants), "user": "acme",
                                "peers": ["acme", "globex"]}}}
    return SchemathesisConfig.from_dict({
        "seed": 20261204,
        "cache": {"enabled": False},
        "generation": {"max-examples": examples, "deterministic": True, "database": "none"},
        "phases": {"enabled": True},
        "checks": {"enabled": True, "max_response_time": MAX_RESPONSE_SECONDS},
        "workers": 1,
        "operations": operations,
        **who,
    })


def fuzz(app: Any, examples: int, tenants: Path | None = None
         ) -> tuple[set[str], list[str], dict[str, set[int]]]:
    """The document's operations, each failure found (readable), and the statuses answered
    per operation."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", app,
                                            config=config(examples, tenants), headers=bearer())
    labels = set()
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            raise result.err()  # an operation the document describes wrongly
        labels.add(result.ok().label)
    failures: list[str] = []
    statuses: dict[str, set[int]] = defaultdict(set)
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            recorder = event.recorder
            for case_id, interaction in recorder.interactions.items():
                if interaction.response is not None:
                    case = recorder.cases[case_id].value
                    statuses[case.operation.label].add(interaction.response.status_code)
            for checks in recorder.checks.values():
                for check in checks:
                    info = check.failure_info
                    if info is not None:
                        failures.append(f"{event.phase.name} {check.name}: {info.failure.title}"
                                        f"\n{info.failure.message}\n{info.code_sample}")
        elif isinstance(event, events.PhaseStarted) and isinstance(
                event.payload, events.StatefulPhasePayload):
            # The links inferred from the document (GET /jobs's names to a trigger, a
            # trigger's new id to its detail, retry and cancel): chains were followed.
            statuses["stateful transitions"].add(event.payload.transitions_selected)
        elif isinstance(event, events.NonFatalError):
            failures.append(f"error in {event.label}: {event.info.format()}")
        elif isinstance(event, events.FatalError):
            raise event.exception
    return labels, sorted(set(failures)), statuses


@pytest.mark.parametrize("who", variants(("operator",), ("tenants",)))
@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_every_operation_passes_every_check(
    web_outbox: Outbox, jobs: dict[str, OutboxJob[Any]], auth: Auth, who: str,
    tmp_path: Path,
) -> None:
    jobs["receipt"].push({"order_id": 1})  # a failed execution: retry, bulk actions, failures
    jobs["receipt"].push({"order_id": 2}, organization_id="acme")
    jobs["receipt"].push({"order_id": 3}, organization_id="globex")  # never acme-ops's
    app = create_app(web_outbox, auth=auth)
    tenants = tmp_path / "tenants.json" if who == "tenants" else None
    labels, failures, statuses = fuzz(app, LONG_EXAMPLES if LONG else EXAMPLES, tenants)
    assert labels >= KNOWN, f"operations missing from the document: {KNOWN - labels}"
    assert not failures, f"{len(failures)} failures:\n\n" + "\n\n".join(failures)
    assert set(statuses) >= labels, f"never requested: {labels - set(statuses)}"
    assert max(statuses["stateful transitions"]) >= 5, statuses["stateful transitions"]
    for label in READS:
        assert 200 in statuses[label], (label, statuses[label])
