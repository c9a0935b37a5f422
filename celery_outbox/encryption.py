"""Encrypted payloads at rest (``@outbox_job(encrypted=True)``, extra ``encryption``).

A job declared ``encrypted=True`` stores its payload column as an envelope,
``{"$encrypted": "<Fernet token>"}``: the payload's JSON text encrypted and authenticated by
``cryptography``'s :class:`~cryptography.fernet.MultiFernet` (AES-128-CBC + HMAC-SHA256; the
token carries the time it was made). Nothing of the plaintext is stored.

Keys (Fernet keys: 32 random bytes, URL-safe base64, :func:`generate_key`) come from the
outbox setting ``encryption_keys`` (``Outbox(app, encryption_keys=[...])`` or
``app.conf.outbox_encryption_keys``), else from the environment variable
``CELERY_OUTBOX_ENCRYPTION_KEYS`` (comma-separated), newest first: the first key encrypts,
every key decrypts, so a rotation gives the new key to every worker first, then puts it
first everywhere and keeps the old ones until ``celery -A proj outbox rotate-keys`` has
re-encrypted the stored payloads (a worker without it retries what it cannot open).

``cryptography`` is imported only when a payload is encrypted or decrypted: the package
installs and imports without it.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import threading
from collections.abc import Sequence
from typing import Any

from celery_outbox.errors import ConfigurationError, OutboxError

ENVELOPE_KEY = "$encrypted"
"""The one key of a stored encrypted payload: ``{"$encrypted": "<Fernet token>"}``."""
ENV_VAR = "CELERY_OUTBOX_ENCRYPTION_KEYS"
"""The environment variable read when the ``encryption_keys`` setting is empty:
comma-separated Fernet keys, newest first."""
SETTING = "encryption_keys"
"""The outbox setting holding the keys (``app.conf.outbox_encryption_keys``)."""
MASK = "encrypted"
"""What the dashboard, the HTTP API and the CLI show in place of an encrypted payload to a
reader who may not see it."""
EXTRA_HINT = "pip install 'celery-outbox[encryption]'"

_JSON = json.JSONEncoder(allow_nan=False)


class PayloadUndecryptable(OutboxError):
    """A stored encrypted payload cannot be decrypted with the configured keys: no key
    configured, the key that encrypted it is not among them, or the token was altered.
    The worker retries the attempt with the job's backoff (a worker without the newest key:
    keys roll to workers first), failing the execution once its attempts run out."""


def is_envelope(value: Any) -> bool:
    """Whether ``value`` (a stored payload) is an encrypted payload's envelope: a dict with
    the one key ``"$encrypted"`` holding a string."""
    return (isinstance(value, dict) and len(value) == 1
            and isinstance(value.get(ENVELOPE_KEY), str))


def generate_key() -> str:
    """A new Fernet key (32 random bytes, URL-safe base64): what ``encryption_keys`` takes."""
    return base64.urlsafe_b64encode(os.urandom(32)).decode("ascii")


def key_problem(key: Any) -> str | None:
    """Why ``key`` is no Fernet key (a str of 32 bytes in URL-safe base64), or None. Checked
    without ``cryptography``; the key itself is never in the answer."""
    if not isinstance(key, str):
        return f"must be a string, got {type(key).__name__}"
    try:
        raw = base64.urlsafe_b64decode(key.encode("ascii"))
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return "is not URL-safe base64 (make one with celery_outbox.encryption.generate_key())"
    if len(raw) != 32:
        return (f"decodes to {len(raw)} bytes, a Fernet key is 32 (make one with "
                "celery_outbox.encryption.generate_key())")
    return None


def split_keys(value: Any) -> tuple[str, ...]:
    """``value`` (a comma-separated str, or a sequence of str) as a tuple of keys, each
    stripped, empty ones left out."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(k.strip() if isinstance(k, str) else k for k in items
                 if not (isinstance(k, str) and not k.strip()))


class Keyring:
    """The keys of one outbox, newest first: the first encrypts, every one decrypts.

    ``source``: where they came from (``"setting"``, ``"environment"`` or ``""`` when there
    are none), for error messages. The MultiFernet is built (and ``cryptography`` imported)
    at the first encryption or decryption.
    """

    def __init__(self, keys: Sequence[str] = (), source: str = "setting") -> None:
        for index, key in enumerate(keys):
            problem = key_problem(key)
            if problem is not None:
                where = ENV_VAR if source == "environment" else SETTING
                raise ConfigurationError(f"{where}[{index}] {problem}", field=SETTING)
        self.keys = tuple(keys)
        self.source = source if self.keys else ""
        self._fernet: Any = None
        self._primary: Any = None
        self._lock = threading.Lock()

    @classmethod
    def load(cls, configured: Sequence[str] = ()) -> Keyring:
        """The keys of the ``encryption_keys`` setting (``configured``), else of the
        environment variable :data:`ENV_VAR`. Raises ConfigurationError naming a malformed
        key by its place."""
        if configured:
            return cls(tuple(configured), "setting")
        return cls(split_keys(os.environ.get(ENV_VAR, "")), "environment")

    def __repr__(self) -> str:  # never the keys
        return f"<Keyring {len(self.keys)} key(s) from {self.source or 'nowhere'}>"

    @property
    def configured(self) -> bool:
        """Whether at least one key is configured."""
        return bool(self.keys)

    def require(self, job_name: str) -> None:
        """Raise :class:`ConfigurationError` naming the setting and the environment variable
        when no key is configured, or naming the extra when ``cryptography`` is missing
        (what an encrypted job's push checks before anything is written)."""
        if not self.keys:
            raise ConfigurationError(
                f"job {job_name!r} is encrypted=True but no encryption key is configured: "
                f"set the outbox setting {SETTING!r} (Outbox(app, {SETTING}=[...]) or "
                f"app.conf.outbox_{SETTING}) or the environment variable {ENV_VAR} "
                "(comma-separated Fernet keys, newest first)", field=SETTING)
        self._fernets()

    def _fernets(self) -> tuple[Any, Any]:
        """(MultiFernet of every key, Fernet of the newest), built once."""
        if self._fernet is None:
            try:
                from cryptography.fernet import Fernet, MultiFernet
            except ImportError as exc:
                raise ConfigurationError(
                    f"encrypted payloads need the cryptography package ({exc}): "
                    f"{EXTRA_HINT}", field=SETTING) from exc
            with self._lock:
                if self._fernet is None:
                    each = [Fernet(k.encode("ascii")) for k in self.keys]
                    self._primary = each[0]
                    self._fernet = MultiFernet(each)
        return self._fernet, self._primary

    def encrypt(self, data: Any, job_name: str = "?") -> dict[str, str]:
        """The envelope of ``data`` (JSON-ready; an object carrying its JSON text as
        ``text`` is not encoded again), encrypted with the newest key. Raises
        ConfigurationError when no key is configured or cryptography is missing."""
        self.require(job_name)
        text = getattr(data, "text", None)
        if not isinstance(text, str):
            text = _JSON.encode(data)
        fernet, _ = self._fernets()
        return {ENVELOPE_KEY: fernet.encrypt(text.encode("utf-8")).decode("ascii")}

    def decrypt(self, envelope: Any) -> Any:
        """The payload an envelope holds (JSON data). Raises :class:`PayloadUndecryptable`
        saying why (no key, no key that opens it, not an envelope); never shows the
        token or a key."""
        if not is_envelope(envelope):
            raise PayloadUndecryptable("the stored payload is not an encrypted envelope")
        if not self.keys:
            raise PayloadUndecryptable(
                f"the payload is encrypted and no encryption key is configured (setting "
                f"{SETTING!r} or environment variable {ENV_VAR})")
        try:
            fernet, _ = self._fernets()
        except ConfigurationError as exc:
            raise PayloadUndecryptable(str(exc)) from None
        from cryptography.fernet import InvalidToken

        try:
            text = fernet.decrypt(envelope[ENVELOPE_KEY].encode("ascii"))
        except (InvalidToken, UnicodeEncodeError, ValueError, TypeError):
            raise PayloadUndecryptable(
                f"the payload cannot be decrypted with the {len(self.keys)} configured "
                f"key(s) (from the {self.source}): the key that encrypted it is not among "
                f"them, or the stored token was altered") from None
        return json.loads(text)

    def current(self, envelope: Any) -> bool:
        """Whether ``envelope`` is encrypted with the newest key already. Raises as
        :meth:`decrypt` when no key opens it."""
        from cryptography.fernet import InvalidToken

        _, primary = self._fernets()
        try:
            primary.decrypt(envelope[ENVELOPE_KEY].encode("ascii"))
            return True
        except InvalidToken:
            pass
        self.decrypt(envelope)  # raises when no key opens it
        return False

    def rotate(self, envelope: Any) -> dict[str, str] | None:
        """``envelope`` re-encrypted with the newest key (its timestamp kept), or None when
        it is encrypted with the newest key already. Raises :class:`PayloadUndecryptable`
        when no configured key opens it."""
        if self.current(envelope):
            return None
        fernet, _ = self._fernets()
        token = fernet.rotate(envelope[ENVELOPE_KEY].encode("ascii"))
        return {ENVELOPE_KEY: token.decode("ascii")}


class Sealed:
    """A payload stored encrypted already (``envelope``), pushed again as it is: an admin
    retry copies an encrypted execution's envelope without decrypting it, so the host that
    retries needs no key."""

    __slots__ = ("envelope",)

    def __init__(self, envelope: dict[str, str]) -> None:
        self.envelope = envelope


def shown(payload: Any, keyring: Keyring | None) -> tuple[Any, bool]:
    """What a reader is shown of a stored ``payload``, and whether it was stored encrypted:
    a plain payload as it is; an envelope decrypted with ``keyring`` (a reader who may see
    encrypted payloads), else :data:`MASK` (also when it cannot be decrypted: the token
    itself is never shown)."""
    if not is_envelope(payload):
        return payload, False
    if keyring is None:
        return MASK, True
    try:
        return keyring.decrypt(payload), True
    except PayloadUndecryptable:
        return MASK, True


__all__ = ["ENVELOPE_KEY", "ENV_VAR", "MASK", "SETTING", "Keyring", "PayloadUndecryptable",
           "Sealed", "generate_key", "is_envelope", "key_problem", "shown", "split_keys"]
