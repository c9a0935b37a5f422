"""Run the fault matrix outside pytest and say how it stands against KNOWN_FAILING:

    .venv/bin/python -m tests.matrix            # SQLite, and PostgreSQL when a server answers
    .venv/bin/python -m tests.matrix worker     # only the cases whose id starts so

Prints each failing case with its first violation, the failing cases KNOWN_FAILING lacks
(new defects, or a fix that changed what fails), and the entries that pass now (fixed: remove
them). ``OUTBOX_TEST_FAULTS=full`` takes the PostgreSQL paths of ``make faults``. Exits 1
when KNOWN_FAILING is not exactly the failing cases of this run.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
import warnings

from sqlalchemy import create_engine, text

from tests.conftest import PG_ADDRESS, PG_ADMIN_URL, port_open
from tests.matrix.cases import discover, run_case
from tests.matrix.known import KNOWN_FAILING
from tests.matrix.world import DATABASES, dispose


def main(prefix: str = "") -> int:
    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    name = None
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    if port_open(*PG_ADDRESS, timeout=0.5):
        name = f"outbox_matrix_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
            conn.execute(text(f'ALTER DATABASE "{name}" SET synchronous_commit = off'))
        DATABASES["postgresql"] = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        found = discover()
        for variant, violations in found.clean.items():
            if violations:
                print(f"path {variant} fails with no fault: {violations[0]}")
        cases = [c for c in found.cases() if c.id.startswith(prefix)]
        failing: dict[str, str] = {}
        for case in cases:
            violations, _ = run_case(case)
            if violations:
                failing[case.id] = violations[0]
                print(f"{case.id}: {violations[0]}")
    finally:
        dispose()
        if name is not None:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    ran = {c.id for c in cases}
    new = sorted(set(failing) - set(KNOWN_FAILING))
    fixed = sorted(k for k in KNOWN_FAILING if k in ran and k not in failing)
    print(f"\n{len(cases)} cases, {len(failing)} failing; {len(new)} not in KNOWN_FAILING, "
          f"{len(fixed)} in it pass now")
    for case_id in new:
        print(f"  new: {case_id}")
    for case_id in fixed:
        print(f"  fixed: {case_id}")
    return 1 if new or fixed else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:2]))
