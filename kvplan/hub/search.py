"""`kvplan models --search`: the bundled catalog (names containing the text, else close matches), or the Hub's
model list in one bounded request."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from kvplan import catalog
from kvplan.errors import InputError
from kvplan.hub.client import Ctx, bounded, hf_module, is_offline, resolve_endpoint, resolve_timeout
from kvplan.hub.errors import explain


@dataclass(frozen=True)
class ModelHit:
    repo_id: str
    aliases: tuple[str, ...] = ()
    source: str = "catalog"  # catalog | hub
    downloads: int | None = None
    gated: bool | str | None = None
    match: str = "substring"  # substring | close | hub


def _list_models_page(hf: Any, ctx: Ctx, text: str, limit: int, token: str | None) -> list[Any]:
    """The first page of HfApi.list_models(search=text, limit=limit), as one request. list_models pages through
    http_backoff, which retries a refused or unresolvable connection five times with back-off: with the network
    down a search spent the whole deadline (10.4 s) where one failed request already says so."""
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_backoff

    params: dict[str, Any] = {"search": text}
    if limit:
        params["limit"] = limit
    response = http_backoff("GET", f"{ctx.endpoint}/api/models", params=params, max_retries=0,
                            headers=build_hf_headers(token=token), timeout=ctx.timeout)
    hf_raise_for_status(response)
    items = response.json()
    if not isinstance(items, list):
        raise ValueError(f"the Hub's model list is not a list ({type(items).__name__})")
    return [hf.ModelInfo(**{"siblings": None, **item}) for item in items if isinstance(item, dict)]


def search_models(
    text: str,
    *,
    hub: bool = False,
    limit: int = 20,
    token: str | None = None,
    timeout: float | str | None = None,
    endpoint: str | None = None,
) -> list[ModelHit]:
    """The bundled catalog (aliases and ids containing the text, else close matches), or with hub=True the Hub's
    model list (HfApi.list_models(search=...)), bounded like every lookup."""
    needle = text.strip().lower()
    if not hub:
        hits: list[ModelHit] = []
        close: list[ModelHit] = []
        for m in sorted(catalog.bundled_models(), key=lambda m: m.repo_id.lower()):
            names = [m.repo_id.lower(), *(a.lower() for a in m.aliases)]
            if any(needle in n for n in names):
                hits.append(ModelHit(m.repo_id, m.aliases))
            elif needle and difflib.get_close_matches(needle, names, n=1, cutoff=0.6):
                close.append(ModelHit(m.repo_id, m.aliases, match="close"))
        found = hits or close  # close matches only when nothing contains the text
        return found[:limit] if limit else found
    if is_offline(None):
        raise InputError("--hub search needs the Hub, but HF_HUB_OFFLINE is set; drop --hub to search the catalog")
    ctx = Ctx(text, "main", resolve_endpoint(endpoint), resolve_timeout(timeout))
    hf = hf_module()
    try:
        found = bounded(lambda: _list_models_page(hf, ctx, text, limit, token), ctx.timeout,
                         f"searching the Hub for {text!r}")
    except Exception as e:
        raise explain(e, ctx).error from None
    return [ModelHit(str(m.id), source="hub", match="hub",
                     downloads=m.downloads if isinstance(m.downloads, int) and not isinstance(m.downloads, bool) and m.downloads >= 0 else None,
                     gated=m.gated if isinstance(m.gated, (bool, str)) else None)
            for m in found if isinstance(m.id, str)]  # a Hub answer is data, not trusted types
