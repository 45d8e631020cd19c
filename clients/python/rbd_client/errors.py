"""Errors raised by the client."""


class RbdError(Exception):
    """An answer from the server with a status outside 2xx.

    Attributes: ``status`` (HTTP status), ``code`` (the server's machine
    code: ``"not_ready"``, ``"contention"``, ``"rate_limited"``,
    ``"shutting_down"``, or None),
    ``message`` (the server's ``error`` text, which names the offending field
    for a 400), ``retry_after`` (seconds, from the Retry-After header, or
    None), ``method`` and ``path`` of the request, and ``rate_limit`` (the
    buffer's rate limiter state of a "rate_limited" answer, a dict, else
    None).
    """

    def __init__(self, status, message, code=None, retry_after=None, method="", path="", rate_limit=None):
        self.status = status
        self.rate_limit = rate_limit
        self.message = message
        self.code = code
        self.retry_after = retry_after
        self.method = method
        self.path = path
        where = ("%s %s: " % (method, path)) if method else ""
        tag = "%d (%s)" % (status, code) if code else "%d" % status
        super().__init__("rbd: %s%s: %s" % (where, tag, message))

    @property
    def not_ready(self):
        """True for a 503 "not_ready": the data cannot satisfy the request yet."""
        return self.status == 503 and self.code == "not_ready"

    @property
    def rate_limited(self):
        """True for a 503 "rate_limited": the buffer's rate limiter held the
        request back until its timeout_ms (``rate_limit`` says why)."""
        return self.status == 503 and self.code == "rate_limited"


class BadRequest(RbdError):
    """400: the request can never succeed as sent; the message names the field."""


class Unauthorized(RbdError):
    """401: missing or wrong bearer token."""


class NotFound(RbdError):
    """404: no such buffer, collector or endpoint."""


class Conflict(RbdError):
    """409: a buffer of that name exists with a different spec."""


class NotReady(RbdError):
    """503 "not_ready" (or "contention"): retry later, or pass timeout_ms."""


class RateLimited(RbdError):
    """503 "rate_limited": the buffer's rate limiter did not admit the
    request within its timeout_ms; ``rate_limit`` holds the limiter's state
    (``blocked``, ``diff``, ``min_diff``, ``max_diff``, ...). Retry after
    ``retry_after``, pass a longer timeout_ms, or construct the Client with
    ``retry_rate_limited=S``."""


class ConnectionFailed(RbdError):
    """The server could not be reached (status 0)."""


_BY_STATUS = {400: BadRequest, 401: Unauthorized, 404: NotFound, 409: Conflict}


def error_for(status, message, code=None, retry_after=None, method="", path="", rate_limit=None):
    """The RbdError subclass for an answer."""
    if status == 503 and code in ("not_ready", "contention"):
        cls = NotReady
    elif status == 503 and code == "rate_limited":
        cls = RateLimited
    else:
        cls = _BY_STATUS.get(status, RbdError)
    return cls(status, message, code, retry_after, method, path, rate_limit)
