"""Dynamo's recompile limits, raised once for every compile the trainer makes.

Dynamo keeps at most `recompile_limit` (default 8) graphs per code object, and past it runs
that code eagerly for good, saying so only in a log warning. Two of our compiles share code
objects across many guard-distinct calls:
- flex attention: a shape dynamo still specialises on must not cost the compiled kernel (a
  run needs about three graphs with dynamic shapes);
- the target's decoder layers: every layer of one class runs one `forward`, and each replica
  on its own GPU fails the others' device guards, so it takes its own graphs (two per
  replica with the warm-up's shapes). Seven replicas on an 8-GPU box need 14: with the
  default, the fifth to seventh ran eagerly."""

from __future__ import annotations

RECOMPILE_LIMIT = 256


def allow_recompiles(limit: int = RECOMPILE_LIMIT) -> None:
    """Raise dynamo's per-code-object limit to `limit` and its total to four times that;
    never lowers either (a user's larger setting stays)."""
    import torch._dynamo

    config = torch._dynamo.config
    # recompile_limit is the newer name of cache_size_limit: set whichever exist.
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name) and getattr(config, name) < limit:
            setattr(config, name, limit)
    for name in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(config, name) and getattr(config, name) < 4 * limit:
            setattr(config, name, 4 * limit)
