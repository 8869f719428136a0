"""One non-empty value per query parameter. No operation of the API takes a list in its query, and none takes
an empty value (the schema says so: deployments.api.contract gives every query string a minimum length), so
`?deployment=1&deployment=2` and `?status=` are a 400 naming the parameter, not a silent choice or no filter.
A method the view does not serve is left to the view (405)."""
from django.http import JsonResponse
from django.urls import Resolver404, resolve

REPEATED = "Given more than once; the API takes one value."
EMPTY = "Empty; give a value or leave the parameter out."


def _served(request) -> bool:
    """Whether the API view at this path answers this method (a ViewSet's routed actions, an APIView's handlers)."""
    try:
        view = resolve(request.path_info).func
    except Resolver404:
        return False
    method = request.method.lower()
    actions = getattr(view, "actions", None)
    if actions is not None:
        return method in actions
    return hasattr(getattr(view, "cls", None), method)


def one_value_per_parameter(get_response):
    def middleware(request):
        if request.path.startswith("/api/v1/") and request.GET:
            errors = {name: [REPEATED if len(values) > 1 else EMPTY] for name, values in request.GET.lists()
                      if len(values) > 1 or values == [""]}
            if errors and _served(request):
                return JsonResponse({"detail": "The request is not valid; see errors.", "errors": errors},
                                    status=400)
        return get_response(request)

    return middleware
