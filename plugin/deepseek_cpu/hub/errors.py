"""`PullError`, and how an exception from a hub call is classified.

`is_network_error` decides what the client retries (and whether a pull may fall back to
what it pulled before); `retry_after` how long the hub asked us to wait. huggingface_hub
is imported inside the functions: `PullError` must be usable without it.
"""
from __future__ import annotations

from ..errors import DeepseekCpuError


class PullError(DeepseekCpuError):
    """A pull cannot go on; the message says why and what to do (one line)."""

    network = False  # True when the hub could not be reached (or kept failing)
    cause: BaseException | None = None  # the exception it was made from


def network_error_types() -> tuple[type, ...]:
    # whichever HTTP stacks are installed: huggingface_hub has used requests, httpx and httpx2
    types: list[type] = [ConnectionError, TimeoutError]
    for mod, names in (("httpx2", ("TransportError",)), ("httpx", ("TransportError",)),
                       ("requests", ("ConnectionError", "Timeout"))):
        try:
            m = __import__(mod)
        except ImportError:
            continue
        types += [getattr(m, n) for n in names if isinstance(getattr(m, n, None), type)]
    return tuple(types)


def is_network_error(e: BaseException | None) -> bool:
    """A failure that may go away on its own: no connection, a timeout, a cut transfer, a
    408 / 429 / 5xx answer; looked for along the exception's causes."""
    from huggingface_hub import errors as E
    seen = 0
    while e is not None and seen < 10:
        if isinstance(e, E.OfflineModeIsEnabled):
            return False
        if isinstance(e, network_error_types()):
            return True
        if isinstance(e, OSError) and "Consistency check failed" in str(e):
            return True
        if isinstance(e, E.HfHubHTTPError) and getattr(e, "response", None) is not None:
            if e.response.status_code in (408, 429) or e.response.status_code >= 500:
                return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def is_server_error(e: BaseException) -> bool:
    """The hub answered, with a 5xx, 408 or 429 (it is up but failing)."""
    from huggingface_hub import errors as E
    resp = getattr(e, "response", None) if isinstance(e, E.HfHubHTTPError) else None
    return resp is not None and (resp.status_code >= 500 or resp.status_code in (408, 429))


def retry_after(e: BaseException) -> float:
    """Seconds the hub asked us to wait (`Retry-After`, else its `RateLimit` reset), or 0."""
    from huggingface_hub.utils import parse_ratelimit_headers
    resp = getattr(e, "response", None)
    if resp is None or resp.status_code not in (429, 503):
        return 0.0
    value = (resp.headers.get("Retry-After") or "").strip()
    if value.isdigit():
        return float(value)
    info = parse_ratelimit_headers(resp.headers)
    return float(info.reset_in_seconds) if info is not None and info.remaining == 0 else 0.0


def short(e: BaseException) -> str:
    """The exception's first line, at most 200 characters: messages stay one line."""
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:200]
