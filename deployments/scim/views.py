"""SCIM 2.0 endpoints at /scim/v2/ (RFC 7644) for the company directory: parse with scim2-models, act through
deployments.services.scim, answer `application/scim+json`.

Every request needs `Authorization: Bearer tds_...` (a SCIM token). Anything refused (bad JSON, an unknown schema,
a PATCH operation or path this service does not support, an unanswerable filter, a conflict) is a SCIM Error
body with its status and scimType, and nothing is changed: a request is validated whole before a service runs.
(One refusal comes after a change: a user the directory deletes whose name is on deployment requests is kept for
that history, 409, but deactivated first.)
"""
import functools
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.http import HttpResponse
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from pydantic import ValidationError
from scim2_models import (Context, Error, Group, InvalidSyntaxException, ListResponse, NotFoundException,
                          NotImplementedException, PatchOp, SCIMException, SearchRequest)

from deployments.errors import ActionError, Conflict
from deployments.models import ScimGroup
from deployments.scim.resources import (ENTRA_GROUP_SCHEMA, GROUP_FILTERS, MAX_RESULTS, PROVIDER, USER_FILTERS,
                                        UserResource, filtered, group_members, group_resource, user_fields,
                                        user_resource)
from deployments.services import scim as services

CONTENT_TYPE = "application/scim+json"
UNIQUE_ATTRIBUTES = {"userName", "displayName"}


def _answer(payload: dict | None, status: int = 200, **headers) -> HttpResponse:
    body = b"" if payload is None else json.dumps(payload).encode()
    return HttpResponse(body, status=status, content_type=CONTENT_TYPE, headers=headers)


def _error(error: Error) -> HttpResponse:
    headers = {"WWW-Authenticate": 'Bearer realm="scim"'} if error.status == 401 else {}
    return _answer(error.model_dump(scim_ctx=Context.DEFAULT), status=error.status, **headers)


def scim_endpoint(view):
    """Bearer-token authentication, and every refusal as a SCIM Error body."""

    @csrf_exempt
    @functools.wraps(view)
    def wrapped(request, *args, **kwargs):
        scheme, _, raw = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or services.scim_token_check(raw.strip()) is None:
            return _error(Error(status=401, detail="A valid SCIM token is needed: Authorization: Bearer tds_..."))
        try:
            with PROVIDER:
                return view(request, *args, **kwargs)
        except SCIMException as e:
            return _error(e.to_error())
        except ValidationError as e:
            return _error(Error.from_validation_errors(e)[0])
        except ActionError as e:  # a service's refusal: a name taken, or a user whose history keeps them
            unique = isinstance(e, Conflict) and e.field in UNIQUE_ATTRIBUTES
            return _error(Error(status=e.status_code, scim_type="uniqueness" if unique else None, detail=e.message))

    return wrapped


def _body(request) -> dict:
    try:
        body = json.loads(request.body)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise InvalidSyntaxException(detail="The request body is not a JSON object.")
    return body


def _search(request, model) -> SearchRequest:
    params = {k: request.GET[k] for k in ("filter", "startIndex", "count", "attributes", "excludedAttributes")
              if k in request.GET}
    return SearchRequest[model].model_validate(params)


@dataclass(frozen=True)
class Endpoint:
    """What differs between /Users and /Groups (deployments/scim/urls.py passes one to the views); the request
    handling (`collection`, `item`) is one."""

    model: type
    route: str  # the URL name of one resource
    rows: Callable[[], QuerySet]
    is_id: Callable[[str], bool]
    to_resource: Callable[..., object]  # (row, location) → resource
    filters: dict[str, str]
    create: Callable[[object], object]  # validated resource → row
    update: Callable[[object, object], object]  # (row, resource) → row
    delete: Callable[[object], None]
    clean: Callable[[dict], dict] = lambda body: body

    def resource(self, request, row):
        return self.to_resource(row, request.build_absolute_uri(reverse(self.route, args=[str(row.pk)])))

    def answer(self, request, row, status=200, **headers) -> HttpResponse:
        dumped = self.resource(request, row).model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE,
                                                        response_parameters=_search(request, self.model))
        return _answer(dumped, status=status, **headers)


@scim_endpoint
def collection(request, ep: Endpoint) -> HttpResponse:
    """GET: a page of the resources a filter selects; POST: create one."""
    if request.method == "POST":
        resource = ep.model.model_validate(ep.clean(_body(request)), scim_ctx=Context.RESOURCE_CREATION_REQUEST)
        row = ep.rows().get(pk=ep.create(resource).pk)
        return ep.answer(request, row, 201, Location=request.build_absolute_uri(reverse(ep.route, args=[str(row.pk)])))
    if request.method != "GET":
        return _error(Error(status=405, detail="GET or POST."))
    search = _search(request, ep.model)
    start = max(search.start_index or 1, 1)
    count = min(MAX_RESULTS if search.count is None else search.count, MAX_RESULTS)
    rows = filtered(ep.rows(), search.filter, ep.filters)
    page = list(rows.order_by("pk")[start - 1:start - 1 + count]) if count > 0 else []
    listing = ListResponse[ep.model](total_results=rows.count(), start_index=start, items_per_page=len(page),
                                     resources=[ep.resource(request, r) for r in page])
    return _answer(listing.model_dump(scim_ctx=Context.SEARCH_RESPONSE, response_parameters=search))


@scim_endpoint
def item(request, pk: str, ep: Endpoint) -> HttpResponse:
    """GET, PUT (replace), PATCH (the operations applied to the stored resource, then saved as a PUT) or DELETE."""
    found = ep.rows().filter(pk=pk).first() if ep.is_id(pk) else None
    if found is None:
        raise NotFoundException(detail=f"No {ep.model.__name__} with id {pk}.")
    if request.method == "GET":
        return ep.answer(request, found)
    if request.method == "DELETE":
        ep.delete(found)
        return _answer(None, 204)
    if request.method == "PUT":
        resource = ep.model.model_validate(ep.clean(_body(request)), scim_ctx=Context.RESOURCE_REPLACEMENT_REQUEST)
    elif request.method == "PATCH":
        patch = PatchOp[ep.model].model_validate(_body(request), scim_ctx=Context.RESOURCE_PATCH_REQUEST)
        resource = ep.resource(request, found)
        patch.patch(resource)
    else:
        return _error(Error(status=405, detail="GET, PUT, PATCH or DELETE."))
    ep.update(found, resource)
    return ep.answer(request, ep.rows().get(pk=found.pk))


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _without_entra_group_schema(body: dict) -> dict:
    if isinstance(body.get("schemas"), list):
        body["schemas"] = [s for s in body["schemas"] if s != ENTRA_GROUP_SCHEMA]
    return body


USERS = Endpoint(
    model=UserResource, route="scim-user", is_id=str.isdigit, to_resource=user_resource, filters=USER_FILTERS,
    rows=lambda: get_user_model().objects.select_related("scim").prefetch_related("scim_groups"),
    create=lambda r: services.scim_user_create(fields=user_fields(r)),
    update=lambda row, r: services.scim_user_update(user=row, fields=user_fields(r)),
    delete=lambda row: services.scim_user_delete(user=row))
GROUPS = Endpoint(
    model=Group, route="scim-group", is_id=_is_uuid, to_resource=group_resource, filters=GROUP_FILTERS,
    rows=lambda: ScimGroup.objects.prefetch_related("members"), clean=_without_entra_group_schema,
    create=lambda r: services.scim_group_create(display_name=r.display_name, external_id=r.external_id or "",
                                                members=group_members(r)),
    update=lambda row, r: services.scim_group_update(group=row, display_name=r.display_name,
                                                     external_id=r.external_id or "", members=group_members(r)),
    delete=lambda row: services.scim_group_delete(group=row))


def _read_only(request) -> HttpResponse | None:
    """The discovery endpoints are read, never written (RFC 7644 §4)."""
    return None if request.method == "GET" else _error(Error(status=405, detail="Only GET."))


@scim_endpoint
def service_provider_config(request):
    return _read_only(request) or _answer(PROVIDER.config.model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE))


def _discovery(request, items, pk):
    """A list of all the ResourceTypes or Schemas, or the one `pk` names."""
    if refused := _read_only(request):
        return refused
    dumped = {str(i.id): i.model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE) for i in items}
    if pk is not None:
        if pk not in dumped:
            raise NotFoundException(detail=f"No {type(items[0]).__name__} with id {pk}.")
        return _answer(dumped[pk])
    return _answer({"schemas": [str(ListResponse.__schema__)], "totalResults": len(dumped), "startIndex": 1,
                    "itemsPerPage": len(dumped), "Resources": list(dumped.values())})


@scim_endpoint
def resource_types(request, pk: str | None = None):
    return _discovery(request, PROVIDER.resource_types, pk)


@scim_endpoint
def schemas(request, pk: str | None = None):
    return _discovery(request, PROVIDER.schemas, pk)


@scim_endpoint
def not_found(request, path: str):
    raise NotFoundException(detail=f"This service has no endpoint {path!r}.")


@scim_endpoint
def search_everything(request):
    raise NotImplementedException(detail="Search one resource type at a time: GET /Users or /Groups with ?filter=.")
