"""Under ``celery worker -P gevent``, kombu's broker reconnect waits must not block the process.

Celery patches ``time`` after ``kombu.utils.functional`` has bound ``time.sleep``, so every wait
between two reconnect tries (``retry_over_time``: 2 s, 4 s, 6 s ... while the broker is down)
blocked the whole worker: no heartbeat, so its leases ran out in the database's clock and other
workers began the next attempts while its handlers stood still, then went on beside them (the
chaos run's overlapping runs on gevent). An Outbox makes that wait the patched one.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("gevent")

SCRIPT = """
import sys
sys.argv = ["celery", "worker", "-P", "gevent"]
from celery import maybe_patch_concurrency
maybe_patch_concurrency()  # what `celery worker -P gevent` does first

import gevent
from celery import Celery
from kombu.utils.functional import retry_over_time
from celery_outbox import JobRegistry, Outbox

Outbox(Celery("green", broker="memory://"), database_url="sqlite://", registry=JobRegistry())
ticks = []

def heartbeat():
    while True:
        ticks.append(1)
        gevent.sleep(0.01)

gevent.spawn(heartbeat)
gevent.sleep(0)

def connect():
    raise ConnectionError("broker down")

try:  # one reconnect wait of 0.5 s, as the consumer's while the broker is down
    retry_over_time(connect, (ConnectionError,), max_retries=1, interval_start=0.5)
except ConnectionError:
    pass
print(len(ticks))
"""


def test_a_broker_reconnect_wait_lets_the_other_greenlets_run() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    ticks = int(done.stdout.split()[-1])
    assert ticks >= 10, f"the other greenlets ran {ticks} time(s) in a 0.5 s reconnect wait"
