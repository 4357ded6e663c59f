"""What a running OpenAI-compatible server says about itself, asked once before a run sends to it:

* which model it serves (``GET /v1/models``): a server that cannot be reached, or that does not serve the
  model the run asks for, is a one-line TargetError that says what to do, not a run of failed requests;
* what it is (``ServerInfo.label``, e.g. ``vllm 0.32.0 (url)``): the engine from its model's ``owned_by``
  or its ``Server`` header, the version from ``GET /version`` or that header;
* which request shapes it takes (``probe_request_shape``): token-id prompts and vLLM's ``ignore_eos`` are
  extensions another server may refuse (HTTP 400), so one tiny request of each settles ``auto``;
* and, before each run, that it forgets its cached prefixes (``reset_prefix_cache``).
"""
from __future__ import annotations

import functools
import json
import urllib.error
import urllib.request
from dataclasses import dataclass

from stallfree.engine.config_checks import ConfigError
from stallfree.loadgen.config.errors import TargetError
from stallfree.loadgen.targets.base import RequestShape

TIMEOUT_S = 10.0
URL_SUFFIX = "(url)"  # a label names where the server is: one the bench did not start
PROBE_TOKEN_IDS = [1, 2, 3]


@dataclass(frozen=True)
class ServerInfo:
    served_model: str  # the "model" of each request
    engine: str | None  # what serves it: its model's owned_by, else its Server header's product
    version: str | None  # /version, else the Server header's product version

    @property
    def label(self) -> str:
        """e.g. ``vllm 0.32.0 (url)``; the served model stands in for an engine that says nothing of itself."""
        name = " ".join(part for part in (self.engine or self.served_model, self.version) if part)
        return f"{name} {URL_SUFFIX}"


def _get(url: str, path: str) -> tuple[dict, dict[str, str]]:
    """The JSON body and the lower-cased headers of ``GET url + path``."""
    with urllib.request.urlopen(f"{url}{path}", timeout=TIMEOUT_S) as response:
        return json.loads(response.read()), {k.lower(): v for k, v in response.headers.items()}


def _models(url: str) -> tuple[list[dict], dict[str, str]]:
    try:
        body, headers = _get(url, "/v1/models")
    except urllib.error.HTTPError as e:
        raise TargetError(f"target.url: {url}/v1/models answered HTTP {e.code}; is {url} an OpenAI-compatible "
                          f"server (and, with an API key, is it open to this client)?") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise TargetError(f"target.url: cannot reach {url} ({reason}); start the server or fix target.url") from None
    return [m for m in body.get("data", []) if isinstance(m, dict) and "id" in m], headers


def served_models(url: str) -> list[str]:
    """The ids of the models the server at ``url`` serves; a TargetError when it cannot be reached."""
    return [m["id"] for m in _models(url)[0]]


def _pick_model(url: str, models: list[str], served_model: str | None) -> str:
    """The model the run sends as ``model``: ``served_model``, which the server must serve, or (None)
    the server's only model."""
    if served_model is None:
        if len(models) != 1:
            raise TargetError(f"target.served_model: {url} serves {models or 'no model'}; "
                              "set target.served_model=ONE_OF_THEM")
        return models[0]
    if models and served_model not in models:
        raise TargetError(f"target.served_model: {url} does not serve {served_model!r} (it serves "
                          f"{', '.join(models)}); set target.served_model={models[0]}")
    return served_model


def _version(url: str) -> str | None:
    """``GET /version``'s version (vLLM's), None where the server has no such route."""
    try:
        body, _ = _get(url, "/version")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    version = body.get("version") if isinstance(body, dict) else None
    return str(version) if version else None


@functools.cache
def describe_server(url: str, served_model: str | None) -> ServerInfo:
    """The server at ``url`` as it describes itself (asked once per process: plans and targets share it)."""
    models, headers = _models(url)
    model = _pick_model(url, [m["id"] for m in models], served_model)
    owned_by = next((m.get("owned_by") for m in models if m["id"] == model), None)
    product, _, product_version = headers.get("server", "").split(" ")[0].partition("/")
    engine = owned_by if owned_by not in (None, "", "organization-owner") else product or None
    return ServerInfo(model, engine, _version(url) or product_version or None)


def _rejection(url: str, path: str, body: dict) -> str | None:
    """None when ``url`` takes the request, else the HTTP 400 it answered (its message)."""
    request = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            response.read()
    except urllib.error.HTTPError as e:
        text = e.read().decode(errors="replace")
        if e.code not in (400, 422):
            raise TargetError(f"target.url: a one-token probe request to {url}{path} answered HTTP {e.code}: "
                              f"{text[:200]}") from None
        try:
            message = json.loads(text)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = text
        return f"HTTP {e.code}: {' '.join(str(message).split())[:200]}"
    except (urllib.error.URLError, OSError) as e:
        raise TargetError(f"target.url: cannot reach {url} ({getattr(e, 'reason', e)}); start the server "
                          "or fix target.url") from None
    return None


def _settle(setting: str | bool, key: str, what: str, rejection: str | None) -> bool:
    """An ``auto | true | false`` setting once the probe answered: ``true`` and refused is a config error."""
    if setting is True and rejection is not None:
        raise ConfigError(f"the server rejected {what} ({rejection}): set target.{key}=false")
    return setting is True or (setting == "auto" and rejection is None)


def probe_request_shape(url: str, model: str, token_ids: str | bool, ignore_eos: str | bool) -> RequestShape:
    """The request shape to send ``url``: each setting ``auto`` or ``true`` is tried with one tiny,
    non-streamed completion (a token-id prompt; a text prompt with ``ignore_eos``)."""
    base = {"model": model, "max_tokens": 1, "temperature": 0}
    ids_refused = eos_refused = None
    if token_ids is not False:
        ids_refused = _rejection(url, "/v1/completions", {**base, "prompt": PROBE_TOKEN_IDS})
    if ignore_eos is not False:
        eos_refused = _rejection(url, "/v1/completions", {**base, "prompt": "Hello", "ignore_eos": True})
    return RequestShape(_settle(token_ids, "token_ids", "token-id prompts", ids_refused),
                        _settle(ignore_eos, "ignore_eos", "ignore_eos", eos_refused))


def reset_prefix_cache(url: str) -> str:
    """``POST /reset_prefix_cache`` (stallfree-serve's and vLLM's route): a sweep's runs send the same prompts,
    so a server whose prefix cache kept them would skip the prefills of every run after the first. What
    happened, for the run's summary: ``reset``, or ``not reset: ...`` (vLLM has the route only with
    VLLM_SERVER_DEV_MODE=1; its hit rate then says how much the runs before warmed it)."""
    request = urllib.request.Request(f"{url}/reset_prefix_cache", data=b"", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            response.read()
    except urllib.error.HTTPError as e:
        return f"not reset: POST /reset_prefix_cache answered HTTP {e.code}"
    except (urllib.error.URLError, OSError) as e:
        return f"not reset: POST /reset_prefix_cache failed ({getattr(e, 'reason', e)})"
    return "reset"
