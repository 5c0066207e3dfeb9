"""Domain errors. One root; the API maps each to an HTTP status in one handler."""

from __future__ import annotations


class EtrainError(Exception):
    """Root of every etrain service error."""

    status_code = 500


class InvalidSpec(EtrainError):
    """A job spec or plan request is malformed or impossible."""

    status_code = 422

    def __init__(self, message: str, errors: list[dict] | None = None):
        super().__init__(message)
        self.errors = errors or [{"loc": [], "msg": message}]


class JobNotFound(EtrainError):
    """No job with this id is visible to the caller."""

    status_code = 404


class InvalidTransition(EtrainError):
    """A job status change the state machine forbids."""

    status_code = 409


class Unauthorized(EtrainError):
    """Missing or unknown API token."""

    status_code = 401


class Forbidden(EtrainError):
    """The token is valid but may not do this."""

    status_code = 403


class BackendUnavailable(EtrainError):
    """The Ray cluster (or KubeRay API) cannot be reached."""

    status_code = 503


class BackendError(EtrainError):
    """The backend refused or failed an operation."""

    status_code = 502


class QuotaExceeded(EtrainError):
    """A tenant's quota refuses the request (for now)."""

    status_code = 429
