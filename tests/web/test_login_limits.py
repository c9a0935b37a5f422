"""Login rate limits: failed password checks per user name and per client address, and the
PBKDF2 work bounded, so guessing is slow and a flood of bad credentials starves nobody.

Before the limits a client could try 12 to 25 passwords a second, and a flood of bad Basic
credentials took every thread of the server's pool (PBKDF2 is slow on purpose): a valid
request then took 4.6 s instead of 4.5 ms.
"""

from __future__ import annotations

import base64
import http.client
import json
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from celery_outbox import ConfigurationError, Outbox
from celery_outbox.web import (
    Auth,
    LoginLimits,
    Token,
    TooManyAttempts,
    User,
    create_app,
    hash_secret,
)
from tests.web.conftest import PASSWORDS, TOKEN, serve

sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def basic(name: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()}


def limited_auth(attempts: int) -> Auth:
    return Auth(users=[User("ops", password_hash=hash_secret(PASSWORDS["ops"]), access="operate"),
                       User("viewer", password_hash=hash_secret(PASSWORDS["viewer"]))],
                tokens=[Token("ci", token_hash=hash_secret(TOKEN, kind="token"))],
                login_limits=LoginLimits(attempts=attempts, window=timedelta(minutes=1)))


@sqlite_only
def test_failed_logins_are_limited_per_user_and_per_address(web_outbox: Outbox,
                                                            jobs: Any) -> None:
    auth = limited_auth(attempts=3)
    app = create_app(web_outbox, auth=auth)

    def at(address: str) -> TestClient:
        return TestClient(app, client=(address, 5000))

    # One user name guessed from three addresses: the fourth guess is refused unhashed,
    # even with the right password; another user from the same address is not.
    for i in range(3):
        assert at(f"10.0.0.{i}").get("/api/v1/me", headers=basic("ops", "nope")).status_code == 401
    for password in ("nope", PASSWORDS["ops"]):
        r = at("10.0.0.9").get("/api/v1/me", headers=basic("ops", password))
        assert r.status_code == 429, r.text
        assert 1 <= int(r.headers["retry-after"]) <= 60 and "user" in r.json()["detail"]
    assert at("10.0.0.9").get("/api/v1/me",
                              headers=basic("viewer", PASSWORDS["viewer"])).status_code == 200

    # One address guessing many names (unknown ones too): refused for every name, even a
    # right password; another address is not.
    for name in ("root", "admin", "viewer"):
        assert at("10.0.1.1").get("/api/v1/me", headers=basic(name, "nope")).status_code == 401
    viewer = {"username": "viewer", "password": PASSWORDS["viewer"]}
    form = at("10.0.1.1").post("/login", data=viewer, follow_redirects=False)
    assert form.status_code == 429 and 1 <= int(form.headers["retry-after"]) <= 60
    assert "outbox_session" not in form.cookies and "address: try again in" in form.text
    # The viewer logs in from elsewhere; a bearer token and a Basic header already verified
    # (remembered for a minute) are no password check.
    assert at("10.0.1.2").post("/login", data=viewer,
                               follow_redirects=False).status_code == 303
    for verified in ({"Authorization": f"Bearer {TOKEN}"},
                     basic("viewer", PASSWORDS["viewer"])):
        assert at("10.0.1.1").get("/api/v1/me", headers=verified).status_code == 200

    # The buckets refill: attempts / window per second.
    clock = auth._throttle.clock
    auth._throttle.clock = lambda: clock() + 61
    assert at("10.0.1.1").get("/api/v1/me",
                              headers=basic("ops", PASSWORDS["ops"])).status_code == 200


@sqlite_only
def test_concurrent_guesses_never_pass_the_limit_together(web_outbox: Outbox,
                                                          jobs: Any) -> None:
    """The token is taken before the hash: 12 guesses at once for one user cost at most
    ``attempts`` password checks."""
    auth = limited_auth(attempts=4)
    app = create_app(web_outbox, auth=auth)
    codes: list[int] = []

    def guess(i: int) -> None:
        with TestClient(app, client=(f"10.2.0.{i}", 5000)) as c:
            codes.append(c.get("/api/v1/me", headers=basic("ops", f"guess{i}")).status_code)

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(codes) == 12 and set(codes) <= {401, 429}
    assert codes.count(401) <= 4, codes


def test_bad_limits_are_refused_at_setup() -> None:
    with pytest.raises(ConfigurationError, match="attempts"):
        LoginLimits(attempts=0)
    with pytest.raises(ConfigurationError, match="window"):
        LoginLimits(window=timedelta(0))
    with pytest.raises(ConfigurationError, match="window"):
        LoginLimits(window=60)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="login_limits"):
        Auth(login_limits={"attempts": 3})  # type: ignore[arg-type]


FLOOD = """
import base64, http.client, json, sys, threading, time
port, seconds = int(sys.argv[1]), float(sys.argv[2])
answered, stop = [], time.monotonic() + seconds
def flood(i):
    n = 0
    while time.monotonic() < stop:
        n += 1
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30,
                                          source_address=(f"127.0.3.{i + 10}", 0))
        value = base64.b64encode(f"u{i}-{n}:bad".encode()).decode()
        try:
            conn.request("GET", "/api/v1/me", headers={"Authorization": "Basic " + value})
            answered.append(conn.getresponse().status)
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.25)
threads = [threading.Thread(target=flood, args=(i,)) for i in range(100)]
for t in threads:
    t.start()
while len(answered) < 100 and time.monotonic() < stop:
    time.sleep(0.05)
print("flooding", flush=True)
for t in threads:
    t.join()
print(json.dumps(sorted(set(answered))), flush=True)
"""
"""100 clients in a process of their own, each from its own loopback address (so no
per-address bucket stops them soon), guessing its own names, each again 0.25 s after its
answer: more guesses at once than the server has threads."""


@sqlite_only
def test_a_flood_of_bad_credentials_starves_no_valid_request(web_outbox: Outbox,
                                                            jobs: Any) -> None:
    """While 100 clients flood a real server with bad Basic credentials (``FLOOD``), a
    remembered Basic login, a bearer token and a session still answer fast: the hashing
    runs in at most ``hashing_slots`` at once and a refused check holds no thread of the
    server's pool (before: each waited behind the flood's PBKDF2 for a thread, 1 to 5 s)."""
    app = create_app(web_outbox, auth=limited_auth(attempts=5))
    with serve(app) as url:
        port = int(url.rsplit(":", 1)[1])

        def timed(headers: dict[str, str]) -> float:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                started = time.perf_counter()
                conn.request("GET", "/api/v1/me", headers=headers)
                status = conn.getresponse().status
                took = time.perf_counter() - started
            finally:
                conn.close()
            assert status == 200, (headers, status)
            return took

        ops = basic("ops", PASSWORDS["ops"])
        timed(ops)  # verified once: remembered for a minute, as a browser resends it
        with TestClient(app, base_url=url) as c:
            session = c.post("/login", data={"username": "viewer",
                                             "password": PASSWORDS["viewer"]},
                             follow_redirects=False).cookies["outbox_session"]
        flood = subprocess.Popen([sys.executable, "-c", FLOOD, str(port), "8"],
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert flood.stdout is not None
            assert flood.stdout.readline().strip() == "flooding"
            took = [timed(h) for h in (ops, {"Authorization": f"Bearer {TOKEN}"},
                                       {"Cookie": f"outbox_session={session}"}) * 8]
            out, _ = flood.communicate(timeout=60)
        finally:
            if flood.poll() is None:
                flood.kill()
                flood.wait(10)
        answered = json.loads(out.strip().splitlines()[-1])
        took.sort()
        # Before: every one behind the flood, 2.4 to 4.3 s; bounds with room for a loaded machine.
        assert took[len(took) // 2] < 0.5 and took[-1] < 2.0, took
        assert 429 in answered, answered


def test_an_ipv6_client_is_counted_by_its_64_and_a_busy_slot_touches_no_bucket() -> None:
    """A host holds a whole IPv6 /64: counted per address, each guess would find a fresh
    bucket. And a login refused because every hashing slot is busy takes no token and adds
    no bucket: before, such cheap refusals filled the remembered buckets until a locked
    user's was forgotten, and its guesses allowed again."""
    from celery_outbox.web.auth import RETRY_AFTER_MAX, _Throttle

    auth = Auth(users=[User("ops", password_hash=hash_secret(PASSWORDS["ops"]))],
                login_limits=LoginLimits(attempts=2))
    for i in range(2):
        assert auth.login(f"guess{i}", "x", address=f"2001:db8::{i + 1}") is None
    with pytest.raises(TooManyAttempts, match="address"):
        auth.login("guess9", "x", address="2001:db8::ffff")
    assert auth.login("ops", PASSWORDS["ops"], address="2001:db8:1::1") is not None

    throttle = _Throttle(LoginLimits(attempts=1, hashing_slots=1, max_keys=3))
    assert throttle.check(["user:ops"], lambda: False) is False  # ops is now locked
    throttle._slots.acquire()  # every slot busy (a flood's checks)
    for i in range(10):
        with pytest.raises(TooManyAttempts, match="slot"):
            throttle.check([f"user:u{i}", f"address:10.0.0.{i}"], lambda: True)
    throttle._slots.release()
    with pytest.raises(TooManyAttempts, match="user"):
        throttle.check(["user:ops"], lambda: True)  # still locked: nothing was forgotten

    slow = _Throttle(LoginLimits(attempts=1, window=timedelta.max))
    slow.check(["user:ops"], lambda: False)
    with pytest.raises(TooManyAttempts) as refused:
        slow.check(["user:ops"], lambda: False)
    assert refused.value.retry_after == RETRY_AFTER_MAX


@pytest.mark.parametrize("bad", [{"attempts": "5"}, {"attempts": 1.5}, {"hashing_slots": None},
                                 {"max_keys": True}])
def test_limits_that_are_no_ints_are_refused_naming_them(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match="attempts, hashing_slots and max_keys"):
        LoginLimits(**bad)
