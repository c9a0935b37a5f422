"""The key rotation of encrypted payloads: ``celery -A proj outbox rotate-keys``.

Re-encrypts, with the newest key, every stored payload of the jobs declared
``encrypted=True`` that an older key encrypted, in batches of ``batch_size`` rows read by
primary key (one bounded read per batch, then one guarded UPDATE per row that needs it). A
payload the newest key encrypted already is left as it is, so a second run rewrites
nothing. Each rewrite keeps the token's timestamp (:meth:`MultiFernet.rotate`) and is guarded
by the token it replaces: a payload rewritten meanwhile is counted ``changed`` and left.
Once a run reports no ``undecryptable`` payload, the old keys may be removed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any
from uuid import UUID

from celery_outbox.encryption import ENVELOPE_KEY, Keyring, PayloadUndecryptable, is_envelope
from celery_outbox.errors import ConfigurationError
from celery_outbox.registry import JobRegistry
from celery_outbox.store import ExecutionStore

MAX_BATCH = 10_000
"""The largest ``batch_size`` (rows read per statement)."""


@dataclass(frozen=True)
class Rotation:
    """What one rotation did. ``jobs``: the encrypted jobs whose rows it read; ``scanned``:
    their rows read; ``rotated``: payloads re-encrypted with the newest key; ``current``:
    already under the newest key (left as they are); ``plain``: rows stored before the job
    was encrypted (no payload, or a payload in clear: left as they are); ``undecryptable``:
    payloads no configured key opens (left; the key that encrypted them is missing);
    ``changed``: rewritten by someone else between the read and the write (left);
    ``batches``: reads made."""

    jobs: tuple[str, ...]
    scanned: int = 0
    rotated: int = 0
    current: int = 0
    plain: int = 0
    undecryptable: int = 0
    changed: int = 0
    batches: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        data = asdict(self)
        data["jobs"] = list(self.jobs)
        return data


def rotate_keys(store: ExecutionStore, registry: JobRegistry, keyring: Keyring, *,
                batch_size: int = 500, job_names: Iterable[str] | None = None) -> Rotation:
    """Re-encrypt the stored payloads of the encrypted jobs (``job_names``: those of them
    only, each a registered job's full name) with ``keyring``'s newest key; see the module.

    Raises :class:`ConfigurationError` naming ``batch_size`` (not in 1..:data:`MAX_BATCH`),
    ``job`` (a job that is not ``encrypted=True``) or the keys (none configured, no
    cryptography), :class:`StorageError` when the database fails.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) \
            or not 1 <= batch_size <= MAX_BATCH:
        raise ConfigurationError(f"batch_size must be an int in 1..{MAX_BATCH}, got "
                                 f"{batch_size!r}", field="batch_size")
    encrypted = sorted(spec.name for spec in registry if spec.encrypted)
    if job_names is not None:
        wanted = list(dict.fromkeys(job_names))
        for name in wanted:
            if name not in encrypted:
                raise ConfigurationError(f"job {name!r} is not an encrypted=True job; "
                                         f"encrypted jobs: {', '.join(encrypted) or 'none'}",
                                         field="job")
        encrypted = wanted
    keyring.require(encrypted[0] if encrypted else "rotate-keys")
    counts = dict(scanned=0, rotated=0, current=0, plain=0, undecryptable=0, changed=0,
                  batches=0)
    after = UUID(int=0)
    while encrypted:
        batch = store.encrypted_payloads(encrypted, after, batch_size)
        counts["batches"] += 1
        for execution_id, payload in batch:
            counts["scanned"] += 1
            counts[_rotate_one(store, keyring, execution_id, payload)] += 1
        if len(batch) < batch_size:
            break
        after = batch[-1][0]
    return Rotation(jobs=tuple(encrypted), **counts)


def _rotate_one(store: ExecutionStore, keyring: Keyring, execution_id: UUID,
                payload: Any) -> str:
    """Which count the row ``execution_id`` goes to, once rewritten if it needs it."""
    if not is_envelope(payload):
        return "plain"
    try:
        envelope = keyring.rotate(payload)
    except PayloadUndecryptable:
        return "undecryptable"
    if envelope is None:
        return "current"
    hit = store.rewrite_payload(execution_id, payload[ENVELOPE_KEY], envelope)
    return "rotated" if hit else "changed"
