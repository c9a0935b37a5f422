"""Property-based fuzzing of the JSON API from its own OpenAPI document (schemathesis).

Every operation gets valid and invalid requests (bounded: a few dozen each, derandomised so
the default suite is repeatable); every answer must be below 500, have a status code the
document declares for it, and a body matching its declared schema. The same requests
without credentials answer 401. SQLite here: the API tests cover PostgreSQL's SQL.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from celery_outbox import Outbox, OutboxJob
from celery_outbox.web import create_app
from tests.web.conftest import bearer

EXAMPLES = 25
"""Requests per operation and generation mode in the default suite."""


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_api_never_answers_5xx_and_always_matches_its_schema(
    web_outbox: Outbox, jobs: dict[str, OutboxJob[Any]], auth: Any
) -> None:
    execution_id = jobs["receipt"].push({"order_id": 1})  # a failed execution to act on
    app = create_app(web_outbox, auth=auth)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, headers=bearer())
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 9
    checks = [status_code_conformance, content_type_conformance, response_schema_conformance]
    statuses: dict[str, set[int]] = {}
    for operation in operations:
        strategy = st.one_of(operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
                             operation.as_strategy(generation_mode=GenerationMode.NEGATIVE))

        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=strategy, real_id=st.booleans())
        def check(case: Any, real_id: bool) -> None:
            # Half the time, an id that exists: the actions get past their 404.
            if real_id and "execution_id" in (case.path_parameters or {}):
                case.path_parameters["execution_id"] = str(execution_id)
            response = case.call(headers=bearer())
            assert response.status_code < 500, (case.method, case.formatted_path,
                                                response.text)
            case.validate_response(response, checks=checks, headers=bearer())
            statuses.setdefault(case.operation.label, set()).add(response.status_code)
            anonymous = case.call()
            assert anonymous.status_code == 401, (case.method, case.formatted_path)

        check()
    # The fuzzing reached past validation: some requests of each read were answered 200.
    for label in ("GET /api/v1/jobs", "GET /api/v1/executions", "GET /api/v1/failures"):
        assert 200 in statuses[label], (label, statuses[label])
