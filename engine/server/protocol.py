"""OpenAI-compatible request models and the OpenAI-style error body of the server."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from starlette.exceptions import HTTPException

from engine import first_lone_surrogate

MAX_PROMPTS_PER_REQUEST = 256
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256  # the per-token stop-string check is quadratic in this

TokenIds = list[Annotated[int, Field(ge=0)]]
Prompt = str | TokenIds | list[str] | list[TokenIds]
StopStrings = Annotated[list[Annotated[str, Field(min_length=1, max_length=MAX_STOP_STRING_CHARS)]],
                        Field(max_length=MAX_STOP_STRINGS)]


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
    if first["type"] == "unsupported":
        return APIError(400, first["msg"], param=first["ctx"]["name"], code="unsupported_parameter")
    loc = [p for p in first["loc"] if p not in ("body", "query")]
    param = str(loc[0]) if loc else None
    message = f"{param}: {first['msg']}" if param else f"request body: {first['msg']}"
    code = "missing_field" if first["type"] == "missing" else \
        "invalid_type" if first["type"].endswith("_type") else "invalid_value"
    return APIError(400, message, param=param, code=code)


class _Model(BaseModel):
    # strict: no silent coercion ("10" or true are not integers); unknown fields are ignored like vLLM does
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")


class StreamOptions(_Model):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # with include_usage: usage in every chunk (vLLM's extension)


# OpenAI parameters this server does not implement, and the value that asks for nothing: any other value
# is a 400 naming the parameter, never silently ignored (vLLM accepts these; clients rely on them).
UNSUPPORTED = {"logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (False,), "best_of": (None, 1),
               "suffix": (None,), "logit_bias": (None, {}), "presence_penalty": (0, 0.0),
               "frequency_penalty": (0, 0.0), "repetition_penalty": (1, 1.0), "use_beam_search": (False,),
               "prompt_logprobs": (None,), "tools": (None, []), "response_format": (None,), "min_tokens": (0,)}


class _GenerationRequest(_Model):
    model: str | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    top_k: Annotated[int, Field(ge=-1)] = -1
    seed: Annotated[int, Field(ge=-(2**63), lt=2**64)] | None = None
    ignore_eos: bool = False
    stop: StopStrings | None = None
    n: Literal[1] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, data: Any) -> Any:
        for name, defaults in UNSUPPORTED.items():
            if isinstance(data, dict) and name in data and not any(
                    data[name] == d and type(data[name]) is type(d) for d in defaults):
                raise PydanticCustomError("unsupported", "{name}={value!r} is not supported by this server; "
                                          "leave it out", {"name": name, "value": data[name]})
        return data

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop_string(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and self.stream_options.continuous_usage_stats


class CompletionRequest(_GenerationRequest):
    prompt: Prompt
    max_tokens: Annotated[int, Field(ge=1)] = 16

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
    max_tokens: Annotated[int, Field(ge=1)] | None = None  # default: the rest of the context window
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None


class TokenizeRequest(_Model):
    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_special_tokens: bool = True
