"""Who is asking: principals, HTTP Basic users, bearer tokens, a resolver hook, sessions.

Nothing here imports FastAPI: :class:`Principal`, :class:`User`, :class:`Token`, :class:`Auth`
and :func:`hash_secret` work without the ``web`` extra (e.g. in settings modules).

- A :class:`Principal` has a ``name``, an ``access`` (``"read"``: see only; ``"operate"``:
  also trigger, retry, cancel) and optionally an ``organization_id`` (a tenant: it sees and
  acts on that tenant's executions only).
- Secrets are compared in constant time (:func:`hmac.compare_digest`) and are either stored
  hashed (``password_hash`` / ``token_hash`` from :func:`hash_secret`: PBKDF2-SHA256 for
  passwords, SHA-256 for tokens) or read from an environment variable (``password_env`` /
  ``token_env``) at each check, so no plain secret sits in settings.
- Password checks are rate limited (:class:`LoginLimits`): failed attempts per user name and
  per client address, each a token bucket, and at most ``hashing_slots`` PBKDF2 checks at
  once; beyond either, :class:`TooManyAttempts` (the app answers 429 with ``Retry-After``)
  without hashing, so a flood of bad credentials costs the server almost nothing.
- Sessions (the dashboard's login form) are a signed cookie (HMAC-SHA256 with
  ``secret_key``), ``HttpOnly`` and ``SameSite=Strict`` (``Secure`` over HTTPS, as a
  trusted proxy says it), naming the user; the user's access is looked up on every request,
  so removing a user ends their sessions. A logout ends the session everywhere: the web
  app records its :meth:`Auth.session_id` in the database, which every request carrying the
  cookie reads.
- ``trusted_proxies``: the addresses of the reverse proxies in front of the dashboard; from
  them (and only them) ``Forwarded`` / ``X-Forwarded-Proto`` / ``X-Forwarded-For`` say the
  scheme and the client's address (:meth:`Auth.scheme`, :meth:`Auth.client_address`).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import ipaddress
import json
import math
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal
from urllib.parse import urlsplit

from celery_outbox.errors import ConfigurationError

Access = Literal["read", "operate"]
ACCESS_LEVELS = ("read", "operate")
PBKDF2_ITERATIONS = 200_000
SESSION_COOKIE = "outbox_session"
_REVOKE_LOCK = threading.Lock()


@dataclass(frozen=True)
class Principal:
    """Who a request comes from.

    ``access``: ``"read"`` (no actions: trigger, retry and cancel answer 403) or
    ``"operate"``. ``organization_id``: None sees every tenant; a string restricts every read
    and action to that tenant's executions (others answer 404). ``show_encrypted_payloads``:
    this principal sees the payloads of ``encrypted=True`` jobs decrypted (default False:
    shown as ``"encrypted"``, never the stored token), whatever its access.
    """

    name: str
    access: Access = "read"
    organization_id: str | None = None
    show_encrypted_payloads: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigurationError(f"Principal: name must be a non-empty string, got "
                                     f"{self.name!r}")
        if self.access not in ACCESS_LEVELS:
            raise ConfigurationError(f"Principal {self.name!r}: access must be 'read' or "
                                     f"'operate', got {self.access!r}")
        if not isinstance(self.show_encrypted_payloads, bool):
            raise ConfigurationError(f"Principal {self.name!r}: show_encrypted_payloads must "
                                     f"be True or False, got {self.show_encrypted_payloads!r}")

    @property
    def can_operate(self) -> bool:
        """True when this principal may trigger, retry and cancel."""
        return self.access == "operate"


def hash_secret(secret: str, *, kind: Literal["password", "token"] = "password") -> str:
    """The hash to store instead of ``secret``.

    Passwords: ``"pbkdf2_sha256$<iterations>$<salt>$<hash>"`` (slow on purpose);
    tokens (long random strings): ``"sha256$<hash>"``. Raises ConfigurationError for an empty
    secret.
    """
    if not secret:
        raise ConfigurationError("hash_secret: the secret is empty")
    if kind == "token":
        return "sha256$" + hashlib.sha256(secret.encode()).hexdigest()
    salt = secrets.token_hex(16)
    digest = hashlib.pbkdf2_hmac("sha256", secret.encode(), salt.encode(), PBKDF2_ITERATIONS)
    return f"pbkdf2_sha256${PBKDF2_ITERATIONS}${salt}${digest.hex()}"


def verify_secret(secret: str, stored: str) -> bool:
    """True when ``secret`` matches ``stored`` (a :func:`hash_secret` result); constant time."""
    scheme, _, rest = stored.partition("$")
    if scheme == "sha256":
        candidate = hashlib.sha256(secret.encode()).hexdigest()
        return hmac.compare_digest(candidate, rest)
    if scheme == "pbkdf2_sha256":
        try:
            iterations, salt, expected = rest.split("$")
            digest = hashlib.pbkdf2_hmac("sha256", secret.encode(), salt.encode(),
                                         int(iterations))
        except ValueError:
            return False
        return hmac.compare_digest(digest.hex(), expected)
    return False


def _check_stored(what: str, name: str, hashed: str | None, env: str | None) -> None:
    if (hashed is None) == (env is None):
        raise ConfigurationError(
            f"{what} {name!r}: give exactly one of {what.lower()}_hash (from hash_secret) "
            f"and {what.lower()}_env (an environment variable's name)")
    if hashed is not None and hashed.partition("$")[0] not in ("sha256", "pbkdf2_sha256"):
        raise ConfigurationError(f"{what} {name!r}: {what.lower()}_hash is not a hash_secret "
                                 f"result (it starts 'pbkdf2_sha256$' or 'sha256$')")


def _matches(secret: str, hashed: str | None, env: str | None) -> bool:
    if hashed is not None:
        return verify_secret(secret, hashed)
    expected = os.environ.get(env or "")
    if not expected:
        return False  # an unset variable never matches (not even an empty secret)
    return hmac.compare_digest(secret.encode(), expected.encode())


@dataclass(frozen=True)
class User:
    """An HTTP Basic (and login form) user: ``password_hash`` or ``password_env``;
    ``access``, ``organization_id``, ``show_encrypted_payloads`` as :class:`Principal`."""

    name: str
    password_hash: str | None = None
    password_env: str | None = None
    access: Access = "read"
    organization_id: str | None = None
    show_encrypted_payloads: bool = False

    def __post_init__(self) -> None:
        _check_stored("Password", self.name, self.password_hash, self.password_env)
        self.principal()  # validates name and access

    def principal(self) -> Principal:
        return Principal(self.name, self.access, self.organization_id,
                         self.show_encrypted_payloads)

    def check(self, password: str) -> bool:
        """True when ``password`` is this user's (constant-time compare)."""
        return _matches(password, self.password_hash, self.password_env)


@dataclass(frozen=True)
class Token:
    """A bearer token (``Authorization: Bearer <token>``): ``token_hash`` or ``token_env``;
    ``access``, ``organization_id``, ``show_encrypted_payloads`` as :class:`Principal`."""

    name: str
    token_hash: str | None = None
    token_env: str | None = None
    access: Access = "read"
    organization_id: str | None = None
    show_encrypted_payloads: bool = False

    def __post_init__(self) -> None:
        _check_stored("Token", self.name, self.token_hash, self.token_env)
        self.principal()

    def principal(self) -> Principal:
        return Principal(self.name, self.access, self.organization_id,
                         self.show_encrypted_payloads)

    def check(self, token: str) -> bool:
        return _matches(token, self.token_hash, self.token_env)


class TooManyAttempts(Exception):
    """A password check refused before it ran: too many failed attempts for this user name or
    client address, or every hashing slot busy. ``retry_after``: whole seconds to wait."""

    def __init__(self, reason: str, retry_after: int) -> None:
        super().__init__(f"{reason}; retry after {retry_after} s")
        self.reason = reason
        self.retry_after = retry_after


@dataclass(frozen=True)
class LoginLimits:
    """How many password checks an :class:`Auth` runs.

    ``attempts``: failed attempts allowed at once per user name (known or not) and per client
    address; each refills at ``attempts`` per ``window`` (a timedelta), so a guesser gets
    ``attempts`` per ``window`` after its burst. ``hashing_slots``: PBKDF2 checks running at
    once in the process; one more is refused at once (never queued), so a flood from many
    addresses takes at most that many cores and never the server's threads. ``max_keys``:
    the buckets remembered (the least recently used beyond it are forgotten).
    """

    attempts: int = 10
    window: timedelta = timedelta(minutes=1)
    hashing_slots: int = 2
    max_keys: int = 10_000

    def __post_init__(self) -> None:
        counts = (self.attempts, self.hashing_slots, self.max_keys)
        if any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in counts):
            raise ConfigurationError(f"LoginLimits: attempts, hashing_slots and max_keys must "
                                     f"be ints of at least 1, got {self}")
        if not isinstance(self.window, timedelta) or self.window <= timedelta(0):
            raise ConfigurationError(f"LoginLimits: window must be a positive timedelta, got "
                                     f"{self.window!r}")


PROXY_HEADERS = ("x-forwarded", "forwarded")
"""The header families :attr:`Auth.proxy_headers` names."""
RETRY_AFTER_MAX = 86_400
"""Seconds: the longest ``Retry-After`` a refused login is told (a day)."""


class _Throttle:
    """The failed-attempt buckets (one per user name, one per address) and the hashing
    slots of one :class:`Auth`. An attempt takes a token from each of its buckets before it
    hashes (so concurrent guesses cannot all pass a check made before any failed) and gives
    them back when the password was right."""

    def __init__(self, limits: LoginLimits, clock: Callable[[], float] = time.monotonic):
        self.limits = limits
        self.clock = clock
        self.rate = limits.attempts / limits.window.total_seconds()  # tokens per second
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(limits.hashing_slots)

    def _level(self, key: str, now: float) -> float:
        tokens, at = self._buckets.get(key, (float(self.limits.attempts), now))
        return min(float(self.limits.attempts), tokens + (now - at) * self.rate)

    def take(self, keys: list[str]) -> None:
        """One token from each bucket of ``keys``, or TooManyAttempts (nothing taken)."""
        with self._lock:
            now = self.clock()
            levels = {key: self._level(key, now) for key in keys}
            short = {key: level for key, level in levels.items() if level < 1}
            if short:
                wait = max((1 - level) / self.rate for level in short.values())
                what = " and ".join(key.partition(":")[0] for key in short)
                raise TooManyAttempts(f"too many failed logins for this {what}",
                                      max(1, min(RETRY_AFTER_MAX, math.ceil(wait))))
            for key, level in levels.items():
                self._buckets[key] = (level - 1, now)
                self._buckets.move_to_end(key)
            while len(self._buckets) > self.limits.max_keys:
                self._buckets.popitem(last=False)

    def give_back(self, keys: list[str]) -> None:
        with self._lock:
            now = self.clock()
            for key in keys:
                if key in self._buckets:
                    self._buckets[key] = (min(float(self.limits.attempts),
                                              self._level(key, now) + 1), now)

    def check(self, keys: list[str], verify: Callable[[], bool]) -> bool:
        """``verify()`` (a password check) within the limits: TooManyAttempts when a bucket
        is empty or every hashing slot busy; a success gives its tokens back."""
        if not self._slots.acquire(blocking=False):  # refused for load: no bucket touched
            raise TooManyAttempts("every password check slot is busy", 1)
        try:
            self.take(keys)
            ok = verify()
        finally:
            self._slots.release()
        if ok:
            self.give_back(keys)
        return ok


Resolver = Callable[[Any], "Principal | None"]
"""``(request) -> Principal | None``: the host application's own login (a Starlette
``Request``). None means "not this resolver's request": the built-in methods are tried next."""


@dataclass
class Auth:
    """How the dashboard recognises people: a resolver hook, bearer tokens, Basic users.

    Tried in that order on each request; the first that names a principal wins. With none
    configured every request answers 401 (the dashboard is never open by accident).
    ``secret_key`` signs session cookies (default: ``$OUTBOX_WEB_SECRET_KEY``, else random
    per process: sessions then end when the process restarts). ``session_max_age``: seconds.
    ``trusted_origins``: extra ``scheme://host[:port]`` origins allowed to send actions
    (e.g. the public address in front of a proxy that rewrites Host). ``login_limits``: how
    many password checks run (:class:`LoginLimits`: failed attempts per user and address,
    concurrent hashing). ``trusted_proxies``: addresses or networks (``"10.0.0.5"``,
    ``"10.0.0.0/24"``) of the reverse proxies in front of the dashboard, whose
    ``proxy_headers`` are believed (the session cookie is ``Secure`` when they say
    ``https``); from any other peer they are ignored. ``proxy_headers``: which headers those
    proxies write, ``"x-forwarded"`` (``X-Forwarded-For`` / ``X-Forwarded-Proto``: nginx,
    HAProxy, most load balancers; the default) or ``"forwarded"`` (RFC 7239); only that
    family is read, every line of it, so a client's own header of the other family, which a
    proxy passes through untouched, is never taken for the proxy's.
    """

    users: Iterable[User] = ()
    tokens: Iterable[Token] = ()
    resolver: Resolver | None = None
    secret_key: str | None = None
    session_max_age: int = 8 * 3600
    trusted_origins: Iterable[str] = ()
    login_limits: LoginLimits = field(default_factory=LoginLimits)
    trusted_proxies: Iterable[str] = ()
    proxy_headers: str = "x-forwarded"
    _users: dict[str, User] = field(init=False, repr=False)
    _tokens: tuple[Token, ...] = field(init=False, repr=False)
    _cache: dict[str, tuple[float, Principal]] = field(init=False, repr=False)
    _revoked: dict[str, float] = field(init=False, repr=False)
    _throttle: _Throttle = field(init=False, repr=False)
    _proxies: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = field(
        init=False, repr=False)

    def __post_init__(self) -> None:
        self._users = {u.name: u for u in self.users}
        self._tokens = tuple(self.tokens)
        self.trusted_origins = _origins(self.trusted_origins)
        key = self.secret_key or os.environ.get("OUTBOX_WEB_SECRET_KEY")
        self.secret_key = key or secrets.token_urlsafe(32)
        self._cache = {}
        self._revoked = {}
        if not isinstance(self.login_limits, LoginLimits):
            raise ConfigurationError(f"login_limits must be a LoginLimits, got "
                                     f"{self.login_limits!r}")
        self._throttle = _Throttle(self.login_limits)
        self._proxies = _networks(self.trusted_proxies)
        self.trusted_proxies = tuple(str(n) for n in self._proxies)
        if self.proxy_headers not in PROXY_HEADERS:
            raise ConfigurationError(f"proxy_headers must be one of {', '.join(PROXY_HEADERS)}, "
                                     f"got {self.proxy_headers!r}")

    @classmethod
    def from_settings(cls, conf: Mapping[str, Any]) -> Auth:
        """Users and tokens from ``app.conf``: ``outbox_web_users`` and ``outbox_web_tokens``
        (lists of dicts with :class:`User` / :class:`Token` fields), ``outbox_web_secret_key``,
        ``outbox_web_trusted_origins``, ``outbox_web_trusted_proxies``,
        ``outbox_web_proxy_headers``. Raises
        ConfigurationError naming a bad entry."""
        def build(kind: type[Any], key: str) -> list[Any]:
            entries = conf.get(key) or ()
            try:
                return [kind(**e) for e in entries]
            except TypeError as exc:
                raise ConfigurationError(f"{key}: {exc}") from None
        return cls(users=build(User, "outbox_web_users"),
                   tokens=build(Token, "outbox_web_tokens"),
                   secret_key=conf.get("outbox_web_secret_key"),
                   trusted_origins=conf.get("outbox_web_trusted_origins") or (),
                   trusted_proxies=conf.get("outbox_web_trusted_proxies") or (),
                   proxy_headers=conf.get("outbox_web_proxy_headers") or "x-forwarded")

    @property
    def configured(self) -> bool:
        """True when at least one way in exists."""
        return bool(self._users or self._tokens or self.resolver)

    @property
    def has_users(self) -> bool:
        """True when HTTP Basic and the login form may let someone in."""
        return bool(self._users)

    @property
    def has_tokens(self) -> bool:
        """True when a bearer token may let someone in."""
        return bool(self._tokens)

    def user(self, name: str) -> User | None:
        return self._users.get(name)

    def authenticate(self, request: Any) -> tuple[Principal | None, str]:
        """The request's principal and how it was found (``"resolver"``, ``"bearer"``,
        ``"basic"``, ``"session"``), or ``(None, "")``."""
        if self.resolver is not None:
            found = self.resolver(request)
            if found is not None:
                return found, "resolver"
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value:
            return self._cached(header, lambda: self._bearer(value.strip())), "bearer"
        if scheme.lower() == "basic" and value:
            address = self.client_address(request)
            return self._cached(header, lambda: self._basic(value.strip(), address)), "basic"
        cookie = request.cookies.get(SESSION_COOKIE)
        if cookie:
            return self.session_principal(cookie), "session"
        return None, ""

    def _cached(self, header: str, check: Callable[[], Principal | None]) -> Principal | None:
        # PBKDF2 is slow on purpose: remember a verified header for a minute, keyed by its
        # SHA-256 (the header itself is never kept).
        key = hashlib.sha256(header.encode()).hexdigest()
        hit = self._cache.get(key)
        now = time.monotonic()
        if hit is not None and hit[0] > now:
            return hit[1]
        found = check()
        if found is not None:
            if len(self._cache) > 1000:
                self._cache.clear()
            self._cache[key] = (now + 60, found)
        return found

    def _bearer(self, value: str) -> Principal | None:
        for token in self._tokens:
            if token.check(value):
                return token.principal()
        return None

    def _basic(self, value: str, address: str | None) -> Principal | None:
        try:
            name, _, password = base64.b64decode(value).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        return self.login(name, password, address)

    def _peer(self, request: Any) -> str | None:
        client = getattr(request, "client", None)
        return str(client[0]) if client else None

    def _trusted(self, address: str | None) -> bool:
        if not address or not self._proxies:
            return False
        try:
            ip = ipaddress.ip_address(address.strip().strip("[]").partition("%")[0])
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in network for network in self._proxies)

    def _forwarded(self, request: Any, key: str, legacy: str) -> list[str]:
        """The values of ``key`` (``proto``, ``for``) in ``Forwarded`` when ``proxy_headers``
        is ``"forwarded"``, else of the ``legacy`` header (``X-Forwarded-Proto``,
        ``X-Forwarded-For``), every line of it in order, nearest proxy last; none unless the
        peer is a trusted proxy."""
        if not self._trusted(self._peer(request)):
            return []
        headers = request.headers
        if self.proxy_headers == "forwarded":
            found = []
            for element in ",".join(headers.getlist("forwarded")).split(","):
                for pair in element.split(";"):
                    name, _, value = pair.strip().partition("=")
                    if name.strip().lower() == key:
                        found.append(value.strip().strip('"'))
            return found
        return [v.strip() for v in ",".join(headers.getlist(legacy)).split(",") if v.strip()]

    def scheme(self, request: Any) -> str:
        """``https`` or ``http``: the request's own, or what a trusted proxy says it
        received (the nearest proxy's word)."""
        said = self._forwarded(request, "proto", "x-forwarded-proto")
        if said and said[-1].lower() in ("http", "https"):
            return said[-1].lower()
        return str(request.url.scheme)

    def client_address(self, request: Any) -> str | None:
        """The address a request comes from: the server's peer, or, when that is a trusted
        proxy, the nearest address the proxies name that is not one of them. None when the
        server names no peer."""
        peer = self._peer(request)
        for said in reversed(self._forwarded(request, "for", "x-forwarded-for")):
            hop = _ip(_bare_address(said))
            if hop is None:
                return peer  # not an address (unknown, obfuscated, garbage): the peer's word
            if not self._trusted(hop):
                return hop
        return peer

    def login(self, name: str, password: str, address: str | None = None) -> Principal | None:
        """The user's principal when ``password`` is theirs, else None. Raises
        :class:`TooManyAttempts` (before any hashing) past the :class:`LoginLimits` of
        ``name`` or of ``address`` (the client's, when known)."""
        keys = [f"user:{name}"] + ([f"address:{_bucket_of(address)}"] if address else [])
        user = self._users.get(name)
        found: list[Principal] = []

        def verify() -> bool:
            if user is None:
                # Spend the time a check would: a wrong name and a wrong password look alike.
                verify_secret(password, _dummy_hash())
                return False
            if user.password_hash is None:
                # An environment password compares in microseconds: spend the PBKDF2 an
                # unknown name spends, or the response time tells which names exist.
                verify_secret(password, _dummy_hash())
            if user.check(password):
                found.append(user.principal())
            return bool(found)

        return found[0] if self._throttle.check(keys, verify) else None

    # -- sessions -----------------------------------------------------------------------------

    def session_cookie(self, principal: Principal) -> str:
        """A signed session value for ``principal`` (valid ``session_max_age`` seconds)."""
        # A nonce: two logins of one user in the same second are two sessions (a logout
        # ends its own only).
        body = json.dumps({"u": principal.name, "exp": int(time.time()) + self.session_max_age,
                           "n": secrets.token_urlsafe(12)})
        payload = base64.urlsafe_b64encode(body.encode()).decode()
        return f"{payload}.{self._sign(payload)}"

    def session_principal(self, cookie: str) -> Principal | None:
        payload, _, signature = cookie.partition(".")
        if not cookie.isascii():  # compare_digest takes ASCII strings only; ours are
            return None
        if not hmac.compare_digest(self._sign(payload), signature):
            return None
        try:
            data = json.loads(base64.urlsafe_b64decode(payload))
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("exp", 0) < time.time():
            return None
        if signature in self._revoked:
            return None
        user = self._users.get(str(data.get("u")))
        return user.principal() if user is not None else None

    def session_id(self, cookie: str) -> tuple[str, float] | None:
        """``(id, expires)`` of a signed, unexpired session cookie (the id: the SHA-256 of
        its signature, what the database keeps of a revoked session; ``expires``: a Unix
        time), else None."""
        if not self._signed_unexpired(cookie):
            return None
        payload, _, signature = cookie.partition(".")
        data = json.loads(base64.urlsafe_b64decode(payload))
        return hashlib.sha256(signature.encode()).hexdigest(), float(data["exp"])

    def _signed_unexpired(self, cookie: str) -> bool:
        payload, _, signature = cookie.partition(".")
        if not cookie.isascii() or not hmac.compare_digest(self._sign(payload), signature):
            return False
        try:
            data = json.loads(base64.urlsafe_b64decode(payload))
        except ValueError:
            return False
        return isinstance(data, dict) and isinstance(data.get("exp"), int) \
            and data["exp"] >= time.time()

    def revoke_session(self, cookie: str) -> None:
        """End the session ``cookie`` names (logging out) in this process: from now on it
        treats it as no session, though it has not expired (kept in memory until it
        expires). The web app records it in the database too (:meth:`session_id`), for
        every other process and host."""
        if self.session_principal(cookie) is None:
            return
        payload, _, signature = cookie.partition(".")
        data = json.loads(base64.urlsafe_b64decode(payload))
        now = time.time()
        with _REVOKE_LOCK:  # logouts run on several threads: drop the expired, add, as one step
            for gone in [s for s, e in self._revoked.items() if e < now]:
                del self._revoked[gone]
            self._revoked[signature] = float(data["exp"])

    def _sign(self, payload: str) -> str:
        key = str(self.secret_key).encode()
        return hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()


def _bare_address(value: str) -> str:
    """An address as a proxy wrote it, without brackets or port (``[2001:db8::1]:4711``,
    ``192.0.2.1:80``); anything else (``unknown``, an obfuscated name) as it is."""
    value = value.strip().strip('"')
    if value.startswith("["):
        return value[1:].partition("]")[0]
    if value.count(":") == 1:
        return value.partition(":")[0]
    return value


def _ip(value: str) -> str | None:
    """``value`` as an IP address in its normal form, or None when it is none."""
    try:
        return str(ipaddress.ip_address(value.partition("%")[0]))
    except ValueError:
        return None


def _bucket_of(address: str) -> str:
    """The login limits' key of a client address: an IPv6 address by its /64 (one host
    holds a whole /64: counted per address, it would get a fresh bucket per guess)."""
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])
    except ValueError:
        return address[:64]
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else ip)


def _networks(given: Iterable[str]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network,
                                              ...]:
    """Each address or network of ``trusted_proxies``; ConfigurationError naming it for a
    single string or anything else."""
    if isinstance(given, str):
        raise ConfigurationError(f"trusted_proxies must be a list of addresses, got the string "
                                 f"{given!r} (write [{given!r}])")
    if not isinstance(given, Iterable):
        raise ConfigurationError(f"trusted_proxies must be a list of addresses, got {given!r}")
    out = []
    for entry in given:
        try:
            out.append(ipaddress.ip_network(str(entry).strip(), strict=False))
        except ValueError:
            raise ConfigurationError(f"trusted_proxies: {entry!r} is not an IP address or "
                                     f"network (e.g. '10.0.0.5', '10.0.0.0/24')") from None
    return tuple(out)


def _origins(given: Iterable[str]) -> tuple[str, ...]:
    """``scheme://host[:port]`` each (a trailing slash dropped); ConfigurationError naming
    ``trusted_origins`` for a single string or anything else."""
    if isinstance(given, str):
        raise ConfigurationError(f"trusted_origins must be a list of origins, got the string "
                                 f"{given!r} (write [{given!r}])")
    out = []
    for origin in given:
        parts = urlsplit(str(origin).rstrip("/")) if isinstance(origin, str) else None
        if (parts is None or parts.scheme not in ("http", "https") or not parts.netloc
                or parts.path or parts.query or parts.fragment):
            raise ConfigurationError(f"trusted_origins: {origin!r} is not an origin "
                                     f"(scheme://host[:port], e.g. 'https://ops.example.com')")
        out.append(f"{parts.scheme}://{parts.netloc.lower()}")
    return tuple(out)


@functools.cache
def _dummy_hash() -> str:
    return hash_secret("not a password of anyone")
