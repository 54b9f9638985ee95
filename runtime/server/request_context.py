"""Who an HTTP request's engine requests belong to, carried explicitly from where each part is
known (the API-key check knows the tenant, the route the body's salt, adapter and program) to
every engine call the request makes."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

# The key of the ASGI scope's "state" (a route's request.state) under which the API-key check
# leaves the request's tenant.
_TENANT = "braid_tenant"


@dataclass(frozen=True)
class RequestContext:
    """What every engine request of one HTTP request carries. Its prefix-cache scope comes in
    two parts: the API key's `tenant` (under --cache-scope key) and the request's own `salt`
    (its cache_salt field). `lora`: the loaded LoRA adapter it runs under (its `model` names
    one, or /generate's lora_path; None: the base model). `program`: the program state
    /generate's requests come from (its program_id)."""

    tenant: str | None = None
    salt: str | None = None
    lora: str | None = None
    program: str | None = None

    @property
    def cache_salt(self) -> str | None:
        """The engine's cache_salt: the request's engine requests share cached prefixes only
        with those of the same tenant and the same salt."""
        if self.tenant is None and self.salt is None:
            return None
        # A digest of the pair: the radix cache keeps a namespace's key as long as it holds
        # tokens, and a salt's length is the client's to choose.
        return hashlib.sha256(json.dumps([self.tenant, self.salt]).encode()).hexdigest()


def set_tenant(scope: dict[str, Any], tenant: str) -> None:
    """The API-key check's part: the request's tenant, for `context_of` to find. The scope's
    state is replaced, not written into: a server may hand every request the same one."""
    scope["state"] = {**scope.get("state", {}), _TENANT: tenant}


def context_of(
    request: Request,
    salt: str | None = None,
    lora: str | None = None,
    program: str | None = None,
) -> RequestContext:
    """The context of `request`'s engine requests: its tenant (if the API-key check gave it
    one) with what its route read from the body."""
    return RequestContext(getattr(request.state, _TENANT, None), salt, lora, program)
