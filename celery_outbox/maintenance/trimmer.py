"""Trimmer (the trim): per job, keep the newest N succeeded, failed and cancelled rows, delete
the rest.

Each job's surplus goes in ONE statement, whatever its size, so a table that grew while the
trim was off is back to size after one run; the next runs only delete what finished since, and
cost that, not the rows kept: a watermark per job and status (``<table>_trim``) says where the
last run left off (:meth:`ExecutionStore.trim <celery_outbox.store.ExecutionStore.trim>`).
Active rows are never trimmed. A job's ``keep={"succeeded": n, "failed": n, "cancelled": n}``
overrides the defaults (as :meth:`JobSpec.keeps <celery_outbox.registry.JobSpec.keeps>`).

Example::

    Trimmer(outbox.store, outbox.registry).run_once(now)  # TrimResult(deleted=4990, jobs=3)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from celery_outbox.config import MAX_KEEP, OutboxConfig
from celery_outbox.errors import ConfigurationError
from celery_outbox.maintenance.service import check_now, log
from celery_outbox.registry import JobRegistry, JobSpec
from celery_outbox.store import ExecutionStore


@dataclass(frozen=True)
class TrimmerConfig:
    """Options of the :class:`Trimmer` (defaults in brackets).

    - ``keep_succeeded`` [10]: succeeded rows kept per job, unless the job's ``keep`` says.
    - ``keep_failed`` [10]: failed rows kept per job, unless the job's ``keep`` says.
    - ``keep_cancelled`` [10]: cancelled rows kept per job, unless the job's ``keep`` says.

    Raises :class:`ConfigurationError` naming the option when a value is out of range.
    """

    keep_succeeded: int = 10
    keep_failed: int = 10
    keep_cancelled: int = 10

    def __post_init__(self) -> None:
        for name in ("keep_succeeded", "keep_failed", "keep_cancelled"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) \
                    or not 0 <= value <= MAX_KEEP:
                raise ConfigurationError(f"TrimmerConfig.{name} must be an int in "
                                         f"0..{MAX_KEEP}, got {value!r}")

    @classmethod
    def from_outbox(cls, config: OutboxConfig) -> TrimmerConfig:
        return cls(keep_succeeded=config.keep_succeeded, keep_failed=config.keep_failed,
                   keep_cancelled=config.keep_cancelled)

    def keeps(self, spec: JobSpec) -> tuple[int, int]:
        """(succeeded, failed) rows kept for ``spec``: its ``keep``, else these defaults."""
        keep = spec.keep or {}
        return (keep.get("succeeded", self.keep_succeeded),
                keep.get("failed", self.keep_failed))


@dataclass(frozen=True)
class TrimResult:
    """Counts of one :meth:`Trimmer.run_once`: rows ``deleted``, over ``jobs`` jobs trimmed."""

    deleted: int = 0
    jobs: int = 0


class Trimmer:
    """Trims the finished rows of every job in the registry."""

    def __init__(
        self, store: ExecutionStore, registry: JobRegistry, config: TrimmerConfig | None = None
    ) -> None:
        self.store = store
        self.registry = registry
        self.config = config or TrimmerConfig()

    def run_once(self, now: datetime) -> TrimResult:
        """Trim every job once; ``now`` (aware) dates the watermarks and the log line.
        Returns the counts. A job whose trim raises is logged and the others are trimmed;
        then the first error is raised again."""
        check_now(now)
        deleted = jobs = 0
        errors: list[Exception] = []
        for spec in self.registry:
            try:
                count = self._trim(spec, now)
            except Exception as exc:  # one job's trim never stops the others'
                log.exception("celery_outbox: trim of job %r failed; the trim goes on",
                              spec.name)
                errors.append(exc)
                continue
            deleted += count
            jobs += 1 if count else 0
        if deleted:
            log.info("celery_outbox: trim at %s deleted %d finished execution(s) of %d job(s)",
                     now.isoformat(timespec="seconds"), deleted, jobs)
        if errors:
            raise errors[0]
        return TrimResult(deleted=deleted, jobs=jobs)

    def _trim(self, spec: JobSpec, now: datetime) -> int:
        succeeded, failed = self.config.keeps(spec)
        cancelled = (spec.keep or {}).get("cancelled", self.config.keep_cancelled)
        return self.store.trim(spec.name, keep_succeeded=succeeded, keep_failed=failed,
                               keep_cancelled=cancelled, now=now)
