"""The OpenAI-compatible HTTP server over one LLMEngine (FastAPI + uvicorn); the engine core never imports it."""
from stallfree.engine.server.app import ServerConfig, build_app
from stallfree.engine.server.cli import main
from stallfree.engine.server.launcher import ServerHandle, start_server

__all__ = ["ServerConfig", "ServerHandle", "build_app", "main", "start_server"]
