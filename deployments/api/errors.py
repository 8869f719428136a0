"""Every API error is a 4xx JSON body a user can act on: {"detail": ..., "errors": {field: [...]}, "code": ...}
(its schema: deployments.api.contract.ERROR_SCHEMA)."""
from django.db import DataError
from django.http import JsonResponse
from django.views.defaults import page_not_found
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from deployments.errors import ActionError, RateLimited
from deployments.spec import SpecError


def exception_handler(exc, context):
    if isinstance(exc, SpecError):
        return Response({"detail": "The request is not valid; see errors.", "errors": exc.errors},
                        status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, ActionError):
        body = {"detail": exc.message, "code": exc.code}
        if exc.field:
            body["errors"] = {exc.field: [exc.message]}
        headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, RateLimited) else None
        return Response(body, status=exc.status_code, headers=headers)
    if isinstance(exc, DataError):
        # PostgreSQL refuses some values outright (NUL characters, numbers out of range): the input is bad.
        return Response({"detail": "The request holds a value that cannot be stored (for example a NUL "
                                   "character or an out-of-range number)."}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, exceptions.ValidationError):
        # DRF answers a bare {field: [...]} (or a list); every error has the one shape of contract.ERROR_SCHEMA.
        errors = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        return Response({"detail": "The request is not valid; see errors.", "errors": errors},
                        status=status.HTTP_400_BAD_REQUEST)
    return drf_exception_handler(exc, context)


def not_found(request, exception):
    """Django's 404 handler: JSON with the API's error shape under /api/, the usual page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=status.HTTP_404_NOT_FOUND)
    return page_not_found(request, exception)
