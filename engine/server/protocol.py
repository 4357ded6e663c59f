"""OpenAI-compatible request models and the OpenAI-style error body of the server."""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
)
from pydantic_core import PydanticCustomError
from starlette.exceptions import HTTPException

from stallfree.engine import first_lone_surrogate
from stallfree.engine.request_limits import RANGES, SIZES, short_repr

MAX_PROMPTS_PER_REQUEST = SIZES["prompt"].max_items
MAX_STOP_STRINGS = SIZES["stop"].max_items
MAX_STOP_STRING_CHARS = SIZES["stop_string"].max_items


def bounded(kind: type, name: str) -> Any:
    """``kind`` (int or float), checked against ``stallfree.engine.request_limits.RANGES[name]`` (a 400 naming the field)."""
    limit = RANGES[name]

    def in_range(value: int | float) -> int | float:
        if value not in limit:
            raise PydanticCustomError("out_of_range", "must be {range}", {"range": limit.describe()})
        return value

    return Annotated[kind, AfterValidator(in_range)]


TokenIds = list[Annotated[int, Field(ge=0)]]
Prompt = str | TokenIds | list[str] | list[TokenIds]
StopStrings = Annotated[list[Annotated[str, Field(min_length=1, max_length=MAX_STOP_STRING_CHARS)]],
                        Field(max_length=MAX_STOP_STRINGS)]
StopTokenIds = Annotated[list[bounded(int, "stop_token_ids")], Field(max_length=SIZES["stop_token_ids"].max_items)]
LogitBias = Annotated[dict[Annotated[str, Field(pattern=r"^[0-9]{1,19}$")], bounded(float, "logit_bias")],
                      Field(max_length=SIZES["logit_bias"].max_items)]
# OpenAI / vLLM parameters the server does not implement, and the values that ask for nothing: any other
# value is a 400 naming the parameter, never silently ignored (clients rely on them). The first five are
# fields with a range (checked first); the others are not fields of the schema. best_of: only n (which is 1).
NOT_SUPPORTED: dict[str, tuple] = {
    "min_p": (None, 0), "presence_penalty": (None, 0), "frequency_penalty": (None, 0),
    "repetition_penalty": (None, 1), "logit_bias": (None, {}),
    "best_of": (None, 1), "suffix": (None,), "use_beam_search": (False,),
    "prompt_logprobs": (None,), "tools": (None, []), "response_format": (None,), "min_tokens": (None, 0),
}


class APIError(HTTPException):
    """An error the client gets as ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status_code: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(status_code, message, headers)
        self.message, self.type, self.param, self.code = message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers)


def check_unicode(text: str, param: str) -> str:
    """``text``, or a 400 naming ``param`` if it holds a lone UTF-16 surrogate (JSON's "\\ud800", or the
    bytes ED A0 80, which Python's JSON decoder lets through): no tokenizer can encode one."""
    if (index := first_lone_surrogate(text)) is not None:
        raise APIError(400, f"{param}: lone UTF-16 surrogate at index {index} (not valid Unicode)",
                       param=param, code="invalid_unicode")
    return text


def validation_error(exc: RequestValidationError) -> APIError:
    """FastAPI's validation failure (body or query) as an OpenAI-style 400, as vLLM answers it (never
    FastAPI's 422); ``param`` names the first offending field."""
    first = exc.errors()[0]
    if first["type"] == "json_invalid":
        detail = first.get("ctx", {}).get("error", "")
        return APIError(400, f"request body is not valid JSON: {detail}".rstrip(": "), code="invalid_json")
    if isinstance(first.get("input"), bytes):  # FastAPI left a body with a non-JSON content type unparsed
        return APIError(400, "request body must be JSON (Content-Type: application/json)", code="invalid_json")
    loc = [p for p in first["loc"] if p not in ("body", "query")]
    param = str(loc[0]) if loc else None
    message = f"{param}: {first['msg']}" if param else f"request body: {first['msg']}"
    code = "missing_field" if first["type"] == "missing" else \
        "invalid_type" if first["type"].endswith("_type") else "invalid_value"
    return APIError(400, message, param=param, code=code)


class _Model(BaseModel):
    # strict: no silent coercion ("10" or true are not integers); unknown fields are kept apart (model_extra)
    # and otherwise ignored like vLLM does, except the ones NOT_SUPPORTED names
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="allow")


class StreamOptions(_Model):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # with include_usage: usage in every chunk (vLLM's extension)


class _GenerationRequest(_Model):
    model: str | None = None
    temperature: bounded(float, "temperature") = 1.0
    top_p: bounded(float, "top_p") = 1.0
    top_k: bounded(int, "top_k") = -1
    seed: bounded(int, "seed") | None = None
    ignore_eos: bool = False
    stop: StopStrings | None = None
    stop_token_ids: StopTokenIds | None = None
    n: bounded(int, "n") = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    min_p: bounded(float, "min_p") | None = None
    presence_penalty: bounded(float, "presence_penalty") | None = None
    frequency_penalty: bounded(float, "frequency_penalty") | None = None
    repetition_penalty: bounded(float, "repetition_penalty") | None = None
    logit_bias: LogitBias | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop_string(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def check_supported(self) -> None:
        """A 400 naming the first field set to a value this server does not implement (NOT_SUPPORTED)."""
        given = {**(self.model_extra or {}), **{name: getattr(self, name) for name in type(self).model_fields}}
        for name, accepted in NOT_SUPPORTED.items():
            if name in given and (value := given[name]) not in accepted:
                shown = " or ".join(json.dumps(a) for a in accepted)
                raise APIError(400, f"{name}: {short_repr(value)} is not supported by this server (only {shown})",
                               param=name, code="unsupported_parameter")

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and self.stream_options.continuous_usage_stats


class CompletionRequest(_GenerationRequest):
    prompt: Prompt
    max_tokens: bounded(int, "max_tokens") = 16
    logprobs: bounded(int, "logprobs") | None = None
    echo: bool = False  # the prompt's text before the choice's (and with logprobs, its tokens' logprobs)

    def engine_logprobs(self) -> tuple[int | None, int | None]:
        """SamplingParams' (logprobs, prompt_logprobs)."""
        return self.logprobs, self.logprobs if self.echo else None

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _prompt_shape(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Prompt:
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError(
                "prompt_type", "must be a string, a list of token ids (integers >= 0), or a list of either") from None

    def prompts(self) -> list[str | list[int]]:
        """The prompt(s) as a list: one entry per choice."""
        p = self.prompt
        if isinstance(p, str) or not p or isinstance(p[0], int):
            return [p]
        return list(p)


class TextPart(_Model):
    type: Literal["text"]
    text: str


class ChatMessage(_Model):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_GenerationRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: bounded(int, "max_tokens") | None = None  # default: the rest of the context window
    max_completion_tokens: bounded(int, "max_tokens") | None = None
    logprobs: bool = False
    top_logprobs: bounded(int, "top_logprobs") | None = None  # needs logprobs: true

    def engine_logprobs(self) -> tuple[int | None, int | None]:
        """SamplingParams' (logprobs, prompt_logprobs); a 400 for top_logprobs without logprobs (as vLLM)."""
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "top_logprobs: needs logprobs set to true", param="top_logprobs",
                           code="invalid_value")
        return (self.top_logprobs or 0) if self.logprobs else None, None


class TokenizeRequest(_Model):
    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_special_tokens: bool = True
