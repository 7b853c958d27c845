"""S3 and S3-compatible object storage (MinIO, Ceph RGW, …) through boto3.

``s3://bucket/prefix`` URIs behind the same :class:`~drill.storage.base.Storage` protocol as
local paths: a "directory" is a key prefix. Reading an object streams it with concurrent ranged
GETs — ``concurrency`` parts of ``part_size`` bytes in flight, delivered in order — so the
caller hashes each part as it arrives and deserializes the same bytes: no second download, no
temporary file. Memory stays bounded by the parts in flight.

Failures are told apart: 403 and 404 fail at once, naming the bucket and key (``PermissionError``,
``FileNotFoundError``); throttling (503 SlowDown), server errors, connection resets and reads cut
short are retried with exponential backoff and full jitter, bounded by ``max_attempts`` and
``retry_seconds``. Each ranged GET carries the object's ETag (``If-Match``): an object replaced
while it is read is ``FileChanged``, not a silent mix of two versions.

Credentials come from boto3's standard chain (environment, shared config, instance roles) and
are never printed or recorded; the endpoint, region, profile and addressing style come from a
policy's ``checkpoints.s3`` or the environment (see :class:`S3Config`).
"""

from __future__ import annotations

import errno
import io
import os
import random
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import Any

from drill.errors import one_line
from drill.storage.base import (
    CacheState,
    Entry,
    EntryKind,
    FileChanged,
    PathEscapesCheckpoint,
    StorageUnavailable,
    Unaddressable,
)
from drill.units import parse_size

RETRYABLE_STATUS = frozenset({500, 502, 503, 504})
MAX_LIST_PAGES = 10_000
"""Pages of one prefix's listing (1,000 keys each at most): past this, the listing is refused."""
RETRYABLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeTooSkewed",
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class S3Config:
    """How to reach an S3-compatible store; every field also comes from the environment."""

    endpoint_url: str | None = None
    """An S3-compatible endpoint (``http://127.0.0.1:7480``); env ``AWS_ENDPOINT_URL_S3`` or
    ``AWS_ENDPOINT_URL``; None: AWS."""
    region: str | None = None
    """env ``AWS_REGION``/``AWS_DEFAULT_REGION``."""
    profile: str | None = None
    """A profile of the shared AWS config; env ``AWS_PROFILE``."""
    addressing_style: str = "auto"
    """``auto``, ``path`` (most S3-compatible servers) or ``virtual``; env ``DRILL_S3_ADDRESSING_STYLE``."""
    concurrency: int = 8
    """Ranged GETs in flight per object read; env ``DRILL_S3_CONCURRENCY``."""
    part_size: int = 8 << 20
    """Bytes per ranged GET; env ``DRILL_S3_PART_SIZE`` (e.g. ``16MiB``)."""
    max_attempts: int = 6
    """Tries per request, the first included, on throttling, 5xx and connection resets."""
    retry_seconds: float = 120.0
    """Give up retrying a request after this long."""
    timeout: float = 60.0
    """Connect and read timeout per request."""

    def __post_init__(self) -> None:
        if self.addressing_style not in ("auto", "path", "virtual"):
            raise ValueError(f"addressing style {self.addressing_style!r}: expected auto, path or virtual")
        if self.concurrency < 1 or self.part_size < (64 << 10) or self.max_attempts < 1:
            raise ValueError("concurrency and max_attempts must be at least 1, part size at least 64 KiB")

    @classmethod
    def from_env(cls, **overrides: Any) -> S3Config:
        env = os.environ
        given = {k: v for k, v in overrides.items() if v is not None}
        base = cls(
            endpoint_url=env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None,
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
            profile=env.get("AWS_PROFILE") or None,
            addressing_style=env.get("DRILL_S3_ADDRESSING_STYLE", "auto"),
            concurrency=_from_env("DRILL_S3_CONCURRENCY", "8", int, "a whole number"),
            part_size=_from_env("DRILL_S3_PART_SIZE", str(8 << 20), parse_size, "a size"),
        )
        if "part_size" in given:
            given["part_size"] = parse_size(given["part_size"])
        return replace(base, **given)


def _from_env(name: str, default: str, parse: Any, what: str) -> Any:
    """``parse`` of the variable ``name`` (or ``default``); a value it cannot parse is named,
    with ``what`` it should have been."""
    raw = os.environ.get(name, default)
    try:
        return parse(raw)
    except ValueError:
        raise ValueError(f"${name}={raw!r} is not {what}") from None


def split(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` → (``bucket``, ``a/b``)."""
    rest = uri[len("s3://") :] if uri.startswith("s3://") else uri
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise Unaddressable(f"{uri!r} names no bucket")
    return bucket, key.strip("/")


class S3Storage:
    """:class:`~drill.storage.base.Storage` over S3 and S3-compatible stores."""

    positioned_reads = False
    """An object streams through its own concurrent ranged GETs (:class:`S3Object`)."""

    def __init__(self, config: S3Config | None = None) -> None:
        self.config = config or S3Config.from_env()
        self._client: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._heads: dict[str, dict[str, Any]] = {}

    # -- plumbing ---------------------------------------------------------------------------
    @property
    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._new_client()
            return self._client

    def _new_client(self) -> Any:
        """boto3's client for these settings; settings it cannot use are one-line errors: an
        endpoint that is not a URL, a config file that does not parse (:class:`Unaddressable`),
        a profile that is not configured (:class:`PermissionError`: the credentials drill runs
        with)."""
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ProfileNotFound

        c = self.config
        try:
            session = boto3.session.Session(profile_name=c.profile, region_name=c.region)
            return session.client(
                "s3",
                endpoint_url=c.endpoint_url,
                config=Config(
                    s3={"addressing_style": c.addressing_style},
                    retries={"total_max_attempts": 1},  # retried here, counted, with jitter and a deadline
                    max_pool_connections=max(10, 2 * c.concurrency + 4),
                    connect_timeout=c.timeout,
                    read_timeout=c.timeout,
                ),
            )
        except ProfileNotFound as exc:
            raise PermissionError(errno.EACCES, f"S3 settings: {exc}") from None
        except ValueError as exc:  # botocore: "Invalid endpoint: …"
            raise Unaddressable(f"S3 settings: {exc} (an endpoint is a URL: http(s)://host[:port])") from None
        except BotoCoreError as exc:  # nothing is sent in making a client: a config file that does not parse, …
            raise Unaddressable(f"S3 settings: {exc}") from None

    @property
    def pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.config.concurrency * 2, thread_name_prefix="drill-s3")
            return self._pool

    def call(self, what: str, fn: Any, **kw: Any) -> Any:
        """One request, retried when the failure is transient; 403/404 raise at once."""
        return retrying(self.config, what, lambda: fn(**kw))[0]

    # -- the protocol -----------------------------------------------------------------------
    def list(self, uri: str) -> list[Entry]:
        bucket, key = split(uri)
        prefix = f"{key}/" if key else ""
        entries: dict[str, Entry] = {}
        token = None
        pages = 0
        while True:
            pages += 1
            if pages > MAX_LIST_PAGES:  # a listing that never ends (a faulty or hostile endpoint)
                raise StorageUnavailable(
                    errno.E2BIG, f"s3://{bucket}/{prefix}: the listing ran past {MAX_LIST_PAGES} pages without ending"
                )
            kw = {
                "Bucket": bucket,
                "Prefix": prefix,
                "Delimiter": "/",
                **({"ContinuationToken": token} if token else {}),
            }
            page = self.call(f"s3://{bucket}/{prefix} (list)", self.client.list_objects_v2, **kw)
            for p in page.get("CommonPrefixes", []):
                name = p["Prefix"][len(prefix) :].rstrip("/")
                entries[name] = Entry(name, f"s3://{bucket}/{prefix}{name}", EntryKind.DIR, 0, 0.0)
            for o in page.get("Contents", []):
                name = o["Key"][len(prefix) :]
                if name and "/" not in name:
                    entries[name] = Entry(
                        name, f"s3://{bucket}/{o['Key']}", EntryKind.FILE, int(o["Size"]), o["LastModified"].timestamp()
                    )
            if not page.get("IsTruncated"):
                break
            token = page.get("NextContinuationToken")
        if not entries and key:
            self.stat(uri)  # raises FileNotFoundError for a prefix that holds nothing
        return [entries[n] for n in sorted(entries)]

    def stat(self, uri: str) -> Entry:
        bucket, key = split(uri)
        name = key.rsplit("/", 1)[-1] if key else bucket
        if key:
            try:
                head = self._head(bucket, key)
                return Entry(
                    name,
                    f"s3://{bucket}/{key}",
                    EntryKind.FILE,
                    int(head["ContentLength"]),
                    head["LastModified"].timestamp(),
                )
            except FileNotFoundError:
                pass
        page = self.call(
            f"s3://{bucket}/{key}",
            self.client.list_objects_v2,
            Bucket=bucket,
            Prefix=f"{key}/" if key else "",
            MaxKeys=1,
        )
        if page.get("KeyCount", len(page.get("Contents", []))) or page.get("CommonPrefixes") or not key:
            return Entry(name, f"s3://{bucket}/{key}".rstrip("/"), EntryKind.DIR, 0, 0.0)
        raise FileNotFoundError(errno.ENOENT, f"s3://{bucket}/{key}: no such object or prefix")

    def open(self, uri: str) -> io.RawIOBase:
        bucket, key = split(uri)
        head = self._head(bucket, key, fresh=False)
        return S3Object(self, bucket, key, int(head["ContentLength"]), head.get("ETag"))

    def open_below(self, base: str, relative: str) -> tuple[io.RawIOBase, int]:
        f = self.open(self.child(base, relative))
        return f, f.size  # type: ignore[attr-defined]  # an S3Object knows its length from the HEAD

    def child(self, base: str, relative: str) -> str:
        rel = PurePosixPath(relative)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts or "\x00" in relative or "//" in relative:
            raise PathEscapesCheckpoint(f"path {relative!r} escapes checkpoint {base}")
        return f"{base.rstrip('/')}/{'/'.join(rel.parts)}"

    def write(self, uri: str, data: bytes, *, replace: bool = False) -> None:
        bucket, key = split(uri)
        if not replace:
            try:
                self._head(bucket, key)
                raise FileExistsError(errno.EEXIST, f"s3://{bucket}/{key} exists")
            except FileNotFoundError:
                pass
        self.call(f"s3://{bucket}/{key}", self.client.put_object, Bucket=bucket, Key=key, Body=data)
        self._heads.pop(f"{bucket}/{key}", None)

    def normalize(self, uri: str) -> str:
        bucket, key = split(uri)
        return f"s3://{bucket}/{key}" if key else f"s3://{bucket}"

    def cached(self, sizes: Mapping[str, int]) -> CacheState:
        return CacheState(
            sum(sizes.values()), None, "object storage: nothing is cached on this host, every read is cold"
        )

    def evict(self, sizes: Mapping[str, int]) -> CacheState:
        return self.cached(sizes)

    def _head(self, bucket: str, key: str, fresh: bool = True) -> dict[str, Any]:
        cached = self._heads.get(f"{bucket}/{key}")
        if cached is not None and not fresh:
            return cached
        head = self.call(f"s3://{bucket}/{key}", self.client.head_object, Bucket=bucket, Key=key)
        self._heads[f"{bucket}/{key}"] = head
        return head


class S3Object(io.RawIOBase):
    """One object, read in order through concurrent ranged GETs (a bounded read-ahead)."""

    def __init__(self, storage: S3Storage, bucket: str, key: str, size: int, etag: str | None) -> None:
        super().__init__()
        self.storage, self.bucket, self.key, self.size, self.etag = storage, bucket, key, size, etag
        self.retries = 0
        self._pos = 0
        self._scheduled = 0
        self._parts: deque[tuple[int, Future[bytes]]] = deque()

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        if self._pos >= self.size:
            return 0
        self._schedule()
        start, fut = self._parts[0]
        data = fut.result()
        offset = self._pos - start
        n = min(len(b), len(data) - offset)
        memoryview(b).cast("B")[:n] = memoryview(data)[offset : offset + n]
        self._pos += n
        if self._pos >= start + len(data):
            self._parts.popleft()
        return n

    def pread(self, offset: int, n: int) -> bytes:
        """``n`` bytes at ``offset``, out of order: from the read-ahead when its parts cover
        them (a reader peeking at what it is about to stream costs no request), otherwise
        fetched on their own."""
        if n <= 0 or offset >= self.size:
            return b""
        end = min(self.size, offset + n)
        self._schedule()
        if self._parts and self._parts[0][0] <= offset and end <= self._scheduled:
            out = bytearray()
            for start, fut in self._parts:
                if start < end and offset < start + self.storage.config.part_size:
                    data = fut.result()
                    out += data[max(0, offset - start) : end - start]
            return bytes(out)
        return self._get(offset, end)

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        for _, fut in self._parts:
            fut.cancel()
        self._parts.clear()
        super().close()

    def _schedule(self) -> None:
        c = self.storage.config
        # The first part goes alone: an object that is refused or gone costs one request, not
        # ``concurrency`` of them; once it has arrived, the read-ahead opens up.
        width = c.concurrency if self._pos else 1
        while len(self._parts) < width and self._scheduled < self.size:
            start, end = self._scheduled, min(self.size, self._scheduled + c.part_size)
            self._parts.append((start, self.storage.pool.submit(self._get, start, end)))
            self._scheduled = end

    def _get(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of the object, as of the ETag it had when opened."""
        where = f"s3://{self.bucket}/{self.key} bytes {start}..{end}"
        kw: dict[str, Any] = {"Bucket": self.bucket, "Key": self.key, "Range": f"bytes={start}-{end - 1}"}
        if self.etag:
            kw["IfMatch"] = self.etag

        def fetch() -> bytes:
            data = self.storage.client.get_object(**kw)["Body"].read()
            if len(data) != end - start:
                raise _ShortRead(f"{where}: {len(data)} bytes arrived")
            return data

        data, tries = retrying(self.storage.config, where, fetch)
        self.retries += tries
        return data


class _ShortRead(Exception):
    """A response cut short: retried like a connection reset."""


def retrying(config: S3Config, what: str, fn: Any) -> tuple[Any, int]:
    """(fn(), retries it took); transient failures retried with full-jitter backoff, bounded by
    ``config.max_attempts`` and ``config.retry_seconds``; the rest mapped to ``OSError``s."""
    deadline = time.monotonic() + config.retry_seconds
    attempt = 0
    while True:
        try:
            return fn(), attempt
        except Exception as exc:  # noqa: BLE001 - classified below
            err, transient = classify(exc, what)
        attempt += 1
        if not transient or attempt >= config.max_attempts or time.monotonic() >= deadline:
            if transient:
                raise StorageUnavailable(
                    errno.EIO, f"{err.strerror or err} (gave up after {attempt} attempts)"
                ) from None
            raise err from None
        time.sleep(random.uniform(0, min(5.0, 0.1 * 2**attempt)))


def classify(exc: Exception, what: str) -> tuple[OSError, bool]:
    """The error to raise for a failed request, and whether it is worth retrying."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, ParamValidationError

    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code == "NoSuchBucket":
            return FileNotFoundError(errno.ENOENT, f"{what}: no such bucket"), False
        if status == 404 or code in ("NoSuchKey", "404", "NotFound"):
            return FileNotFoundError(errno.ENOENT, f"{what}: no such object"), False
        if status == 403 or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"):
            return PermissionError(errno.EACCES, f"{what}: access denied ({code or status})"), False
        if status in (412, 416) or code in ("PreconditionFailed", "InvalidRange"):
            return FileChanged(f"{what}: the object changed while it was read ({code or status})"), False  # type: ignore[return-value]
        transient = status in RETRYABLE_STATUS or code in RETRYABLE_CODES
        return OSError(errno.EIO, f"{what}: {code or status}"), transient
    if isinstance(exc, NoCredentialsError):
        return PermissionError(
            errno.EACCES, f"{what}: no AWS credentials found (environment, shared config or instance role)"
        ), False
    if isinstance(exc, ParamValidationError) and "Invalid bucket name" in str(exc):  # refused before sending
        return Unaddressable(f"{what}: not a bucket name S3 accepts (letters, digits, '.', '-', '_')"), False
    if (
        isinstance(exc, (BotoCoreError, _ShortRead, ConnectionError, TimeoutError))
        or "IncompleteRead" in type(exc).__name__
    ):
        return OSError(errno.ECONNRESET, f"{what}: {one_line(exc)}"), True
    if isinstance(exc, OSError):
        return exc, exc.errno in (errno.ECONNRESET, errno.ETIMEDOUT, errno.EPIPE)
    return OSError(errno.EIO, f"{what}: {type(exc).__name__}: {exc}"), False
