"""Validation of manifests against the Kubernetes OpenAPI schema, without a cluster.

`kubernetes-validate` (dev extra) ships the JSON schemas generated from each
Kubernetes release's OpenAPI document; its "strict" variants set
`additionalProperties: false` everywhere, as the API server's strict field
validation does, so an unknown or misspelt field fails like a wrong type.
"""

from __future__ import annotations

from typing import Any

from kubernetes_validate.utils import ValidationError as _SchemaError
from kubernetes_validate.utils import validate as _validate

#: The oldest release the rendering targets (RuntimeClass, PSA labels, the static
#: Service IP band are all GA there).
K8S_VERSION = "1.33"


def validate(doc: dict[str, Any]) -> None:
    """Raises `kubernetes_validate.ValidationError` when `doc` is not a valid object."""
    _validate(doc, K8S_VERSION, strict=True)


ValidationError: type[Exception] = _SchemaError
