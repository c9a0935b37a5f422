"""The cases of the matrix that fail today, each for a known defect of the worker or the
executor: strict xfail, so a fix turns them into XPASS(strict) failures and its entries are
removed with it (``python -m tests.matrix`` lists both kinds of change).

Keys are case ids, ``path-query-occurrence-fault`` (:attr:`tests.matrix.cases.Case.id`;
``pg_<path>``: on PostgreSQL, some only with ``OUTBOX_TEST_FAULTS=full``); one list per
defect class, under its reason.
"""

from __future__ import annotations

BASE_EXCEPTION = (
    "a BaseException after an applied write: KeyboardInterrupt / SystemExit "
    "leaves the message's never-begun rows running, held by nobody, until the rescuer takes "
    "them (a row marked started fails 'lease expired' with no handler run), and an outcome "
    "decided but not written is thrown away"
)

POOL_TIMEOUT = (
    "the direct psycopg path's pool TimeoutError is not StorageError: the pool's checkout "
    "raises outside the direct path's error mapping, so sqlalchemy.exc.TimeoutError reaches "
    "the caller raw (a push, or Runner.run, which then hands nothing back)"
)

LOST_CLAIM = (
    "a claim whose answer was lost, or that landed after its timeout: its rows "
    "sit running, held by nobody, for a lease; the first fails 'lease expired' with 0 handler "
    "runs (its attempt counted)"
)

COMBINED_WRITE = (
    "the combined outcome + next start statement failing once: the previous "
    "row's outcome (a success, a final failure, its own cancel) is never written; the "
    "rescuer retries it and its handler runs again"
)

OUTCOME_WRITE = (
    "an outcome, once decided, is not written again: the outcome write alone (or "
    "the held outcomes' one transaction) failing once throws the outcome away; the rescuer "
    "retries it and its handler runs again"
)

HELD_OUTCOMES = (
    "outcomes held (outcome_window) dropped: the next row's start failing once drops them, "
    "unwritten; the rescuer retries them and their handlers run again"
)

_BASE_EXCEPTION_CASES = [
    "worker_one-claim_rows-1-interrupt",
    "worker_one-claim_rows-1-exit",
    "worker-claim_rows-1-interrupt",
    "worker-claim_rows-1-exit",
    "worker-finish_fenced-1-interrupt",
    "worker-finish_fenced-1-exit",
    "worker-finish_fenced-2-interrupt",
    "worker-finish_fenced-2-exit",
    "worker-start_fenced-1-interrupt",
    "worker-start_fenced-1-exit",
    "worker-start_fenced-2-interrupt",
    "worker-start_fenced-2-exit",
    "worker_outcomes-claim_rows-1-interrupt",
    "worker_outcomes-claim_rows-1-exit",
    "worker_outcomes-finish_fenced-1-interrupt",
    "worker_outcomes-finish_fenced-1-exit",
    "worker_outcomes-finish_fenced-2-interrupt",
    "worker_outcomes-finish_fenced-2-exit",
    "worker_outcomes-start_fenced-1-interrupt",
    "worker_outcomes-start_fenced-1-exit",
    "worker_outcomes-start_fenced-2-interrupt",
    "worker_outcomes-start_fenced-2-exit",
    "worker_window-claim_rows-1-interrupt",
    "worker_window-claim_rows-1-exit",
    "worker_window-start_fenced-1-interrupt",
    "worker_window-start_fenced-1-exit",
    "worker_window-start_fenced-2-interrupt",
    "worker_window-start_fenced-2-exit",
    "heartbeat-claim_rows-1-interrupt",
    "heartbeat-claim_rows-1-exit",
    "heartbeat-extend_leases-1-interrupt",
    "heartbeat-extend_leases-1-exit",
    "heartbeat-finish_fenced-1-interrupt",
    "heartbeat-finish_fenced-1-exit",
    "heartbeat-start_fenced-1-interrupt",
    "heartbeat-start_fenced-1-exit",
    "lease_watch-claim_rows-1-interrupt",
    "lease_watch-claim_rows-1-exit",
    "lease_watch-finish_fenced-1-interrupt",
    "lease_watch-finish_fenced-1-exit",
    "lease_watch-extend_leases-1-interrupt",
    "lease_watch-extend_leases-1-exit",
    "lease_watch-start_fenced-1-interrupt",
    "lease_watch-start_fenced-1-exit",
    "worker_skip-claim_rows-1-interrupt",
    "worker_skip-claim_rows-1-exit",
    "worker_skip-start_fenced-1-interrupt",
    "worker_skip-start_fenced-1-exit",
    "worker_skip-start_fenced-2-interrupt",
    "worker_skip-start_fenced-2-exit",
    "worker_skip-finish_fenced-1-interrupt",
    "worker_skip-finish_fenced-1-exit",
    "cancel_running-claim_rows-1-interrupt",
    "cancel_running-claim_rows-1-exit",
    "heartbeat_lost-claim_rows-1-interrupt",
    "heartbeat_lost-claim_rows-1-exit",
    "heartbeat_lost-cancel-1-interrupt",
    "heartbeat_lost-cancel-1-exit",
    "heartbeat_lost-extend_leases-1-interrupt",
    "heartbeat_lost-extend_leases-1-exit",
    "heartbeat_lost-finish_fenced-1-interrupt",
    "heartbeat_lost-finish_fenced-1-exit",
    "heartbeat_lost-start_fenced-1-interrupt",
    "heartbeat_lost-start_fenced-1-exit",
    "heartbeat_lost-confirm_stop-1-interrupt",
    "heartbeat_lost-confirm_stop-1-exit",
    "hand_back-claim_rows-1-interrupt",
    "hand_back-claim_rows-1-exit",
    "hand_back-finish_fenced-1-interrupt",
    "hand_back-finish_fenced-1-exit",
    "pg_worker-claim_rows-1-interrupt",
    "pg_worker-claim_rows-1-exit",
    "pg_worker-finish_and_start-1-interrupt",
    "pg_worker-finish_and_start-1-exit",
    "pg_worker-finish_and_start-2-interrupt",
    "pg_worker-finish_and_start-2-exit",
    "pg_worker_window-claim_rows-1-interrupt",
    "pg_worker_window-claim_rows-1-exit",
    "pg_worker_window-start_unflushed-1-interrupt",
    "pg_worker_window-start_unflushed-1-exit",
    "pg_worker_window-start_unflushed-2-interrupt",
    "pg_worker_window-start_unflushed-2-exit",
    "pg_worker_one-claim_rows-1-interrupt",
    "pg_worker_one-claim_rows-1-exit",
    "pg_hand_back-claim_rows-1-interrupt",
    "pg_hand_back-claim_rows-1-exit",
    "pg_hand_back-finish_fenced-1-interrupt",
    "pg_hand_back-finish_fenced-1-exit",
    "pg_lease_watch-claim_rows-1-interrupt",
    "pg_lease_watch-claim_rows-1-exit",
    "pg_lease_watch-finish_fenced-1-interrupt",
    "pg_lease_watch-finish_fenced-1-exit",
    "pg_lease_watch-extend_leases-1-interrupt",
    "pg_lease_watch-extend_leases-1-exit",
    "pg_lease_watch-start_fenced-1-interrupt",
    "pg_lease_watch-start_fenced-1-exit",
    "pg_heartbeat-claim_rows-1-interrupt",
    "pg_heartbeat-claim_rows-1-exit",
    "pg_heartbeat-extend_leases-1-interrupt",
    "pg_heartbeat-extend_leases-1-exit",
    "pg_heartbeat-finish_and_start-1-interrupt",
    "pg_heartbeat-finish_and_start-1-exit",
]

_POOL_TIMEOUT_CASES = [
    "pg_worker-claim_rows-1-pool",
    "pg_worker-finish_and_start-1-pool",
    "pg_worker-finish_and_start-2-pool",
    "pg_worker-finish_fenced-1-pool",
    "pg_worker_window-claim_rows-1-pool",
    "pg_worker_window-start_unflushed-1-pool",
    "pg_worker_window-start_unflushed-2-pool",
    "pg_worker_window-finish_fenced-1-pool",
    "pg_worker_window-finish_fenced-2-pool",
    "pg_worker_window-finish_fenced-3-pool",
    "pg_push-insert_rows-1-pool",
    "pg_worker_one-claim_rows-1-pool",
    "pg_worker_one-finish_fenced-1-pool",
    "pg_hand_back-claim_rows-1-pool",
    "pg_hand_back-finish_fenced-1-pool",
    "pg_lease_watch-claim_rows-1-pool",
    "pg_lease_watch-finish_fenced-1-pool",
    "pg_lease_watch-finish_fenced-2-pool",
    "pg_lease_watch-start_fenced-1-pool",
    "pg_heartbeat-claim_rows-1-pool",
    "pg_heartbeat-finish_and_start-1-pool",
    "pg_heartbeat-finish_fenced-1-pool",
]

_LOST_CLAIM_CASES = [
    "worker_one-claim_rows-1-lost",
    "worker_one-claim_rows-1-hang",
    "worker-claim_rows-1-lost",
    "worker-claim_rows-1-hang",
    "worker_outcomes-claim_rows-1-lost",
    "worker_outcomes-claim_rows-1-hang",
    "worker_window-claim_rows-1-lost",
    "worker_window-claim_rows-1-hang",
    "heartbeat-claim_rows-1-lost",
    "heartbeat-claim_rows-1-hang",
    "lease_watch-claim_rows-1-lost",
    "lease_watch-claim_rows-1-hang",
    "worker_skip-claim_rows-1-lost",
    "cancel_running-claim_rows-1-lost",
    "cancel_running-claim_rows-1-hang",
    "heartbeat_lost-claim_rows-1-lost",
    "heartbeat_lost-claim_rows-1-hang",
    "hand_back-claim_rows-1-lost",
    "hand_back-claim_rows-1-hang",
    "pg_worker-claim_rows-1-lost",
    "pg_worker-claim_rows-1-hang",
    "pg_worker_window-claim_rows-1-lost",
    "pg_worker_window-claim_rows-1-hang",
    "pg_worker_one-claim_rows-1-lost",
    "pg_worker_one-claim_rows-1-hang",
    "pg_hand_back-claim_rows-1-lost",
    "pg_hand_back-claim_rows-1-hang",
    "pg_lease_watch-claim_rows-1-lost",
    "pg_lease_watch-claim_rows-1-hang",
    "pg_heartbeat-claim_rows-1-lost",
    "pg_heartbeat-claim_rows-1-hang",
]

_COMBINED_WRITE_CASES = [
    "worker-finish_fenced-1-error",
    "worker-finish_fenced-1-pool",
    "worker-finish_fenced-1-interface",
    "worker-start_fenced-1-error",
    "worker-start_fenced-1-pool",
    "worker-start_fenced-1-interface",
    "worker_outcomes-finish_fenced-1-error",
    "worker_outcomes-finish_fenced-1-pool",
    "worker_outcomes-finish_fenced-1-interface",
    "worker_outcomes-finish_fenced-2-error",
    "worker_outcomes-finish_fenced-2-pool",
    "worker_outcomes-finish_fenced-2-interface",
    "worker_outcomes-start_fenced-1-error",
    "worker_outcomes-start_fenced-1-pool",
    "worker_outcomes-start_fenced-1-interface",
    "worker_outcomes-start_fenced-2-error",
    "worker_outcomes-start_fenced-2-pool",
    "worker_outcomes-start_fenced-2-interface",
    "heartbeat-finish_fenced-1-error",
    "heartbeat-finish_fenced-1-pool",
    "heartbeat-finish_fenced-1-interface",
    "heartbeat-start_fenced-1-error",
    "heartbeat-start_fenced-1-pool",
    "heartbeat-start_fenced-1-interface",
    "worker_skip-start_fenced-2-error",
    "worker_skip-start_fenced-2-pool",
    "worker_skip-start_fenced-2-interface",
    "worker_skip-finish_fenced-1-error",
    "worker_skip-finish_fenced-1-pool",
    "worker_skip-finish_fenced-1-interface",
    "pg_worker-finish_and_start-1-error",
    "pg_worker-finish_and_start-1-interface",
    "pg_heartbeat-finish_and_start-1-error",
    "pg_heartbeat-finish_and_start-1-interface",
]

_OUTCOME_WRITE_CASES = [
    "worker_one-finish_fenced-1-error",
    "worker_one-finish_fenced-1-pool",
    "worker_one-finish_fenced-1-interface",
    "worker-finish_fenced-3-error",
    "worker-finish_fenced-3-pool",
    "worker-finish_fenced-3-interface",
    "worker_outcomes-finish_fenced-3-error",
    "worker_outcomes-finish_fenced-3-pool",
    "worker_outcomes-finish_fenced-3-interface",
    "worker_window-finish_fenced-1-error",
    "worker_window-finish_fenced-1-pool",
    "worker_window-finish_fenced-1-interface",
    "worker_window-finish_fenced-2-error",
    "worker_window-finish_fenced-2-pool",
    "worker_window-finish_fenced-2-interface",
    "worker_window-finish_fenced-3-error",
    "worker_window-finish_fenced-3-pool",
    "worker_window-finish_fenced-3-interface",
    "heartbeat-finish_fenced-2-error",
    "heartbeat-finish_fenced-2-pool",
    "heartbeat-finish_fenced-2-interface",
    "lease_watch-finish_fenced-1-error",
    "lease_watch-finish_fenced-1-pool",
    "lease_watch-finish_fenced-1-interface",
    "lease_watch-finish_fenced-2-error",
    "lease_watch-finish_fenced-2-pool",
    "lease_watch-finish_fenced-2-interface",
    "worker_skip-finish_fenced-2-error",
    "worker_skip-finish_fenced-2-pool",
    "worker_skip-finish_fenced-2-interface",
    "heartbeat_lost-finish_fenced-2-error",
    "heartbeat_lost-finish_fenced-2-pool",
    "heartbeat_lost-finish_fenced-2-interface",
    "hand_back-finish_fenced-1-error",
    "hand_back-finish_fenced-1-pool",
    "hand_back-finish_fenced-1-interface",
    "pg_worker-finish_fenced-1-error",
    "pg_worker-finish_fenced-1-interface",
    "pg_worker_window-finish_fenced-1-error",
    "pg_worker_window-finish_fenced-1-interface",
    "pg_worker_window-finish_fenced-2-error",
    "pg_worker_window-finish_fenced-2-interface",
    "pg_worker_window-finish_fenced-3-error",
    "pg_worker_window-finish_fenced-3-interface",
    "pg_worker_one-finish_fenced-1-error",
    "pg_worker_one-finish_fenced-1-interface",
    "pg_hand_back-finish_fenced-1-error",
    "pg_hand_back-finish_fenced-1-interface",
    "pg_lease_watch-finish_fenced-1-error",
    "pg_lease_watch-finish_fenced-1-interface",
    "pg_lease_watch-finish_fenced-2-error",
    "pg_lease_watch-finish_fenced-2-interface",
    "pg_heartbeat-finish_fenced-1-error",
    "pg_heartbeat-finish_fenced-1-interface",
]

_HELD_OUTCOMES_CASES = [
    "worker_window-start_fenced-1-error",
    "worker_window-start_fenced-1-lost",
    "worker_window-start_fenced-1-hang",
    "worker_window-start_fenced-1-pool",
    "worker_window-start_fenced-1-interface",
    "worker_window-start_fenced-2-error",
    "worker_window-start_fenced-2-lost",
    "worker_window-start_fenced-2-hang",
    "worker_window-start_fenced-2-pool",
    "worker_window-start_fenced-2-interface",
    "pg_worker_window-start_unflushed-1-error",
    "pg_worker_window-start_unflushed-1-lost",
    "pg_worker_window-start_unflushed-1-hang",
    "pg_worker_window-start_unflushed-1-interface",
    "pg_worker_window-start_unflushed-2-error",
    "pg_worker_window-start_unflushed-2-lost",
    "pg_worker_window-start_unflushed-2-hang",
    "pg_worker_window-start_unflushed-2-interface",
]

KNOWN_FAILING: dict[str, str] = {
    **dict.fromkeys(_BASE_EXCEPTION_CASES, BASE_EXCEPTION),
    **dict.fromkeys(_POOL_TIMEOUT_CASES, POOL_TIMEOUT),
    **dict.fromkeys(_LOST_CLAIM_CASES, LOST_CLAIM),
    **dict.fromkeys(_COMBINED_WRITE_CASES, COMBINED_WRITE),
    **dict.fromkeys(_OUTCOME_WRITE_CASES, OUTCOME_WRITE),
    **dict.fromkeys(_HELD_OUTCOMES_CASES, HELD_OUTCOMES),
}
