"""``python -m tests.e2e.debounce_pusher START SECONDS TOTAL FIRST STEP MARK KEY``: one of
several processes pushing one debounced key (the e2e app of :mod:`tests.e2e.debounce_app`,
configured from the environment as its workers are): pushes ``n = FIRST, FIRST + STEP, ...``
below ``TOTAL - 1``, push ``n`` at ``START + SECONDS * n / TOTAL`` (wall clock, shared by the
processes), then prints the ids it was answered, one per line."""

from __future__ import annotations

import sys
import time
from datetime import timedelta

from tests.e2e.debounce_app import Bounce, debounced


def main(argv: list[str]) -> None:
    start, seconds = float(argv[0]), float(argv[1])
    total, first, step = int(argv[2]), int(argv[3]), int(argv[4])
    mark, key = argv[5], argv[6]
    ids = set()
    for n in range(first, total - 1, step):
        ahead = start + seconds * n / total - time.time()
        if ahead > 0:
            time.sleep(ahead)  # pacing the burst, not synchronising: the schedule is the test
        ids.add(debounced.push(Bounce(marker=mark, n=n), key=key,
                               debounce=timedelta(seconds=1), max_wait=timedelta(seconds=3)))
    for execution_id in ids:
        print(execution_id)


if __name__ == "__main__":
    main(sys.argv[1:])
