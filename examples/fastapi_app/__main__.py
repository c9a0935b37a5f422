"""``python -m examples.fastapi_app``: the FastAPI example with a real worker and a real
server (uvicorn).

Starts from empty tables (it drops and recreates the example's tables and the outbox's in
``FASTAPI_EXAMPLE_DATABASE_URL``; on the embedded default it deletes its SQLite files),
starts ``celery -A examples.fastapi_app.app:celery worker`` and ``uvicorn``, places an order
through the sync endpoint (``push(session=Session)``) and one through the async endpoint
(``await apush(session=AsyncSession)``), and a declined order through each (rolled back: no
order, no job), waits until the worker sent each receipt once, lists the executions through
the admin endpoint, prints one line per check and exits non-zero if one failed. ``--serve``
then keeps both running (the API's docs at ``http://127.0.0.1:PORT/docs``) until Ctrl-C.
"""

from __future__ import annotations

import argparse

from examples import demo
from examples.fastapi_app import app as example


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.fastapi_app")
    parser.add_argument("--serve", action="store_true", help="keep serving after the checks")
    parser.add_argument("--port", type=int, default=0, help="default: a free port")
    args = parser.parse_args()
    if example.DATABASE_URL.startswith("sqlite") and example.BROKER_URL.startswith("sqla+"):
        demo.reset_files(example.DATA_DIR, "fastapi_example.sqlite3", "fastapi_broker.sqlite3")
    example.create_tables()
    port = args.port or demo.free_port()
    base = f"http://127.0.0.1:{port}"
    server = ["uvicorn", "examples.fastapi_app.app:app", "--port", str(port)]
    with demo.worker_and_server("examples.fastapi_app.app:celery", example.QUEUE, server, port,
                                example.DATA_DIR / "logs"):
        placed = {}
        for customer, path in (("alice", "/orders"), ("bob", "/async/orders")):
            status, body = demo.call("POST", f"{base}{path}", {"customer": customer})
            assert status == 201, (status, body)
            placed[path] = body["id"]
        declined = {path: demo.call("POST", f"{base}{path}", {"customer": "mallory"})[0]
                    for path in placed}
        demo.wait_until("every receipt", lambda: all(
            demo.call("GET", f"{base}/orders/{i}")[1]["receipts"] >= 1 for i in placed.values()))
        receipts = {path: demo.call("GET", f"{base}/orders/{i}")[1]["receipts"]
                    for path, i in placed.items()}
        status, executions = demo.call("GET", f"{base}/admin/executions")
        checks = [
            (f"POST {path}: order {placed[path]}, one receipt", receipts[path] == 1)
            for path in placed
        ] + [
            (f"POST {path} declined ({code}): rolled back", code == 402)
            for path, code in declined.items()
        ] + [
            (f"GET /admin/executions: {len(executions)} executions, all succeeded",
             status == 200 and len(executions) == 2
             and all(e["status"] == "succeeded" for e in executions)),
        ]
        for line, ok in checks:
            print(f"{'ok  ' if ok else 'FAIL'} {line}")
        if args.serve:
            print(f"try: {base}/docs")
            demo.serve_forever()
    example.outbox.flush()
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
