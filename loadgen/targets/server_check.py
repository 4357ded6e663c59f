"""What a running OpenAI-compatible server says about itself (``GET /v1/models``), checked before a run
sends to it: a server that cannot be reached, or that does not serve the model the run asks for, is a
one-line TargetError that says what to do, not a run of failed requests."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

from stallfree.loadgen.sweep.run_errors import TargetError

TIMEOUT_S = 10.0


def served_models(url: str) -> list[str]:
    """The model ids ``url`` serves."""
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=TIMEOUT_S) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as e:
        raise TargetError(f"target.url: {url}/v1/models answered HTTP {e.code}; is {url} an OpenAI-compatible "
                          f"server (and, with an API key, is it open to this client)?") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise TargetError(f"target.url: cannot reach {url} ({reason}); start the server or fix target.url") from None
    return [m["id"] for m in body.get("data", []) if isinstance(m, dict) and "id" in m]


def check_server(url: str, served_model: str | None) -> str:
    """The model the run sends as ``model``: ``served_model``, which the server must serve, or (None)
    the server's only model."""
    models = served_models(url)
    if served_model is None:
        if len(models) != 1:
            raise TargetError(f"target.served_model: {url} serves {models or 'no model'}; "
                              "set target.served_model=ONE_OF_THEM")
        return models[0]
    if models and served_model not in models:
        raise TargetError(f"target.served_model: {url} does not serve {served_model!r} (it serves "
                          f"{', '.join(models)}); set target.served_model={models[0]}")
    return served_model
