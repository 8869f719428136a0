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

from django.contrib.auth import get_user_model
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


def _location(request, name: str, pk) -> str:
    return request.build_absolute_uri(reverse(name, args=[str(pk)]))


def _search(request, model) -> SearchRequest:
    params = {k: request.GET[k] for k in ("filter", "startIndex", "count", "attributes", "excludedAttributes")
              if k in request.GET}
    return SearchRequest[model].model_validate(params)


def _list(request, model, rows, to_resource) -> HttpResponse:
    search = _search(request, model)
    start, count = max(search.start_index or 1, 1), min(MAX_RESULTS if search.count is None else search.count,
                                                         MAX_RESULTS)
    rows = filtered(rows, search.filter, USER_FILTERS if model is UserResource else GROUP_FILTERS)
    page = list(rows.order_by("pk")[start - 1:start - 1 + count]) if count > 0 else []
    listing = ListResponse[model](total_results=rows.count(), start_index=start, items_per_page=len(page),
                                  resources=[to_resource(r) for r in page])
    return _answer(listing.model_dump(scim_ctx=Context.SEARCH_RESPONSE, response_parameters=search))


def _users():
    return get_user_model().objects.select_related("scim").prefetch_related("scim_groups")


def _user_answer(request, user, status=200, **headers) -> HttpResponse:
    resource = user_resource(user, _location(request, "scim-user", user.pk))
    return _answer(resource.model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE,
                                       response_parameters=_search(request, UserResource)), status=status, **headers)


@scim_endpoint
def users(request):
    if request.method == "GET":
        return _list(request, UserResource, _users(),
                     lambda u: user_resource(u, _location(request, "scim-user", u.pk)))
    if request.method != "POST":
        return _error(Error(status=405, detail="GET or POST."))
    resource = UserResource.model_validate(_body(request), scim_ctx=Context.RESOURCE_CREATION_REQUEST)
    user = services.scim_user_create(fields=user_fields(resource))
    return _user_answer(request, _users().get(pk=user.pk), 201,
                        Location=_location(request, "scim-user", user.pk))


@scim_endpoint
def user(request, pk: str):
    found = _users().filter(pk=pk).first() if pk.isdigit() else None
    if found is None:
        raise NotFoundException(detail=f"No user with id {pk}.")
    if request.method == "GET":
        return _user_answer(request, found)
    if request.method == "DELETE":
        services.scim_user_delete(user=found)
        return _answer(None, 204)
    if request.method == "PUT":
        resource = UserResource.model_validate(_body(request), scim_ctx=Context.RESOURCE_REPLACEMENT_REQUEST)
    elif request.method == "PATCH":
        patch = PatchOp[UserResource].model_validate(_body(request), scim_ctx=Context.RESOURCE_PATCH_REQUEST)
        resource = user_resource(found, "")
        patch.patch(resource)
    else:
        return _error(Error(status=405, detail="GET, PUT, PATCH or DELETE."))
    services.scim_user_update(user=found, fields=user_fields(resource))
    return _user_answer(request, _users().get(pk=found.pk))


def _group_body(request) -> dict:
    body = _body(request)
    if isinstance(body.get("schemas"), list):
        body["schemas"] = [s for s in body["schemas"] if s != ENTRA_GROUP_SCHEMA]
    return body


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _groups():
    return ScimGroup.objects.prefetch_related("members")


def _group_answer(request, group, status=200, **headers) -> HttpResponse:
    resource = group_resource(group, _location(request, "scim-group", group.pk))
    return _answer(resource.model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE,
                                       response_parameters=_search(request, Group)), status=status, **headers)


@scim_endpoint
def groups(request):
    if request.method == "GET":
        return _list(request, Group, _groups(), lambda g: group_resource(g, _location(request, "scim-group", g.pk)))
    if request.method != "POST":
        return _error(Error(status=405, detail="GET or POST."))
    resource = Group.model_validate(_group_body(request), scim_ctx=Context.RESOURCE_CREATION_REQUEST)
    group = services.scim_group_create(display_name=resource.display_name, external_id=resource.external_id or "",
                                       members=group_members(resource))
    return _group_answer(request, _groups().get(pk=group.pk), 201,
                         Location=_location(request, "scim-group", group.pk))


@scim_endpoint
def group(request, pk: str):
    found = _groups().filter(pk=pk).first() if _is_uuid(pk) else None
    if found is None:
        raise NotFoundException(detail=f"No group with id {pk}.")
    if request.method == "GET":
        return _group_answer(request, found)
    if request.method == "DELETE":
        services.scim_group_delete(group=found)
        return _answer(None, 204)
    if request.method == "PUT":
        resource = Group.model_validate(_group_body(request), scim_ctx=Context.RESOURCE_REPLACEMENT_REQUEST)
    elif request.method == "PATCH":
        patch = PatchOp[Group].model_validate(_body(request), scim_ctx=Context.RESOURCE_PATCH_REQUEST)
        resource = group_resource(found, "")
        patch.patch(resource)
    else:
        return _error(Error(status=405, detail="GET, PUT, PATCH or DELETE."))
    services.scim_group_update(group=found, display_name=resource.display_name,
                               external_id=resource.external_id or "", members=group_members(resource))
    return _group_answer(request, _groups().get(pk=found.pk))


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
