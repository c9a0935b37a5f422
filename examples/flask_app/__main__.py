"""``python -m examples.flask_app``: the Flask example with a real worker and a real server.

Starts from empty tables (it drops and recreates the example's tables and the outbox's in
``FLASK_EXAMPLE_DATABASE_URL``; on the embedded default it deletes its SQLite files), starts
``celery -A examples.flask_app.app:celery worker`` and ``flask run``, signs up two users
(each welcome is pushed with ``session=db.session``), one refused address and one request
that fails with an error (both roll back: no row, no job), waits until the worker welcomed
each user once, prints one line per check and exits non-zero if one failed. ``--serve``
then keeps both running (``curl -X POST -H 'Content-Type: application/json' -d
'{"email": "you@example.com"}' http://127.0.0.1:PORT/signups``) until Ctrl-C.
"""

from __future__ import annotations

import argparse

from sqlalchemy import func, select

from examples import demo
from examples.flask_app import app as example


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.flask_app")
    parser.add_argument("--serve", action="store_true", help="keep serving after the checks")
    parser.add_argument("--port", type=int, default=0, help="default: a free port")
    args = parser.parse_args()
    if example.DATABASE_URL.startswith("sqlite") and example.BROKER_URL.startswith("sqla+"):
        demo.reset_files(example.DATA_DIR, "flask_example.sqlite3", "flask_broker.sqlite3")
    example.create_tables()
    port = args.port or demo.free_port()
    base = f"http://127.0.0.1:{port}"
    server = ["flask", "--app", "examples.flask_app.app", "run", "--port", str(port)]
    with demo.worker_and_server("examples.flask_app.app:celery", example.QUEUE, server, port,
                                example.DATA_DIR / "logs"):
        users = ["alice@example.com", "bob@example.com"]
        ids = []
        for email in users:
            status, body = demo.call("POST", f"{base}/signups", {"email": email})
            assert status == 201, (status, body)
            ids.append(body["id"])
        refused = demo.call("POST", f"{base}/signups", {"email": "eve@blocked.example"})
        failed = demo.call("POST", f"{base}/signups", {"email": "crash@example.com"})
        demo.wait_until("every welcome", lambda: all(
            demo.call("GET", f"{base}/signups/{i}")[1]["welcomed"] >= 1 for i in ids))
        welcomed = [demo.call("GET", f"{base}/signups/{i}")[1]["welcomed"] for i in ids]
        with example.app.app_context():
            rows = example.db.session.scalar(select(func.count()).select_from(example.Signup))
        executions = example.outbox.admin.list_executions(example.send_welcome.name)
        checks = [
            (f"{email} signed up and welcomed once", count == 1)
            for email, count in zip(users, welcomed, strict=True)
        ] + [
            (f"eve@blocked.example refused ({refused[0]}): rolled back", refused[0] == 422),
            (f"crash@example.com failed ({failed[0]}): rolled back", failed[0] == 500),
            (f"{rows} signup rows, {len(executions)} executions, all succeeded",
             rows == 2 and len(executions) == 2
             and all(e.status == "succeeded" for e in executions)),
        ]
        for line, ok in checks:
            print(f"{'ok  ' if ok else 'FAIL'} {line}")
        if args.serve:
            print(f'try: curl -X POST -H "Content-Type: application/json" '
                  f'-d \'{{"email": "you@example.com"}}\' {base}/signups')
            demo.serve_forever()
    example.outbox.flush()
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
