"""The gateway's FastAPI routes (what each does: :mod:`roll.agentic.gateway.server`). Handlers are plain ``def``:
FastAPI runs them on its thread pool, where they block on the generation loop."""

from __future__ import annotations

from typing import Any

from roll.agentic.gateway.openai_format import server_sent_events
from roll.agentic.gateway.session import GatewayError

#: Requests served at once (FastAPI's default of 40 threads would cap a generate call at 40 prompts).
MAX_CONCURRENT_REQUESTS = 4096


def build_app(gateway: Any) -> Any:
    """The app serving ``gateway`` (a :class:`~roll.agentic.gateway.server.Gateway`); errors are OpenAI-style
    ``{"error": {"message", "type", "code"}}``."""
    from contextlib import asynccontextmanager

    import anyio
    from fastapi import Body, FastAPI, Header, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from starlette.exceptions import HTTPException

    @asynccontextmanager
    async def lifespan(_: Any):  # one worker thread per waiting request: a turn's requests batch into one call
        anyio.to_thread.current_default_thread_limiter().total_tokens = MAX_CONCURRENT_REQUESTS
        yield

    app = FastAPI(title="roll gateway", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)

    @app.exception_handler(GatewayError)
    def _error(_: Request, exc: GatewayError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(HTTPException)
    def _http_error(request: Request, exc: HTTPException) -> JSONResponse:  # unknown routes, wrong methods
        what = f"{request.method} {request.url.path}"
        message = f"roll's gateway does not serve {what}; it serves POST /v1/chat/completions and GET /v1/models"
        if request.url.path.rstrip("/").endswith(("/responses", "/completions")) and "chat" not in request.url.path:
            message += (
                " (the Responses and legacy Completions APIs are not served: use your framework's chat-completions"
                " model class, docs/agents.md)"
            )
        code = "not_found" if exc.status_code == 404 else "method_not_allowed"
        return _error(request, GatewayError(exc.status_code, message, code))

    @app.exception_handler(RequestValidationError)
    def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:  # a body that is not JSON
        return _error(request, GatewayError(400, f"the request body is not a JSON object: {exc.errors()[:1]}"))

    def admin(authorization: str | None) -> None:
        if (authorization or "").removeprefix("Bearer ").strip() != gateway.admin_key:
            raise GatewayError(401, "this route needs the gateway's admin key", "invalid_api_key")

    @app.post("/v1/chat/completions")
    def chat(body: dict = Body(...), authorization: str | None = Header(None)) -> Any:
        response = gateway.complete(gateway.session_of(authorization), body)
        if not body.get("stream"):
            return response
        usage = bool((body.get("stream_options") or {}).get("include_usage"))  # sampled as without streaming
        return Response(server_sent_events(response, usage), media_type="text/event-stream")

    @app.get("/v1/models")
    def models(authorization: str | None = Header(None)) -> dict:
        gateway.session_of(authorization)
        return {"object": "list", "data": [{"id": gateway.model_name, "object": "model", "owned_by": "roll"}]}

    @app.post("/v1/reward")
    def reward(body: dict = Body(...), authorization: str | None = Header(None)) -> dict:
        session = gateway.session_of(authorization)
        try:
            value = float(body["reward"])
        except (KeyError, TypeError, ValueError):
            raise GatewayError(400, f"reward must be a number, got {body.get('reward')!r}") from None
        turn = body.get("turn")
        gateway.post_reward(session, value, None if turn is None else int(turn))
        return {"ok": True}

    @app.post("/sessions")
    def start(body: dict = Body(default={}), authorization: str | None = Header(None)) -> dict:
        admin(authorization)
        sid, key = gateway.start_session(
            int(body.get("max_tokens", gateway.sampling.max_new_tokens)),
            body.get("tool_parser", "hermes"),
            max_turns=int(body.get("max_turns", 0)),
        )
        return {"session_id": sid, "api_key": key, "base_url": gateway.base_url}

    @app.post("/sessions/{session_id}/end")
    def end(session_id: str, authorization: str | None = Header(None)) -> dict:
        admin(authorization)
        session = gateway.end_session(session_id)
        if session is None:
            raise GatewayError(404, f"no live session {session_id!r}", "not_found")
        return {"turns": len(session.turns), "template_breaks": session.template_breaks, "reward": session.reward}

    return app
