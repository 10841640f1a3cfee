"""The gateway's FastAPI routes (what each does: :mod:`roll.agentic.gateway.server`). Handlers are plain ``def``:
FastAPI runs them on its thread pool, where they block on the generation loop."""

from __future__ import annotations

from typing import Any

from roll.agentic.gateway.session import GatewayError

#: Requests served at once (FastAPI's default of 40 threads would cap a generate call at 40 prompts).
MAX_CONCURRENT_REQUESTS = 4096


def build_app(gateway: Any) -> Any:
    """The app serving ``gateway`` (a :class:`~roll.agentic.gateway.server.Gateway`); errors are OpenAI-style
    ``{"error": {"message", "type", "code"}}``."""
    from contextlib import asynccontextmanager

    import anyio
    from fastapi import Body, FastAPI, Header, Request
    from fastapi.responses import JSONResponse

    @asynccontextmanager
    async def lifespan(_: Any):  # one worker thread per waiting request: a turn's requests batch into one call
        anyio.to_thread.current_default_thread_limiter().total_tokens = MAX_CONCURRENT_REQUESTS
        yield

    app = FastAPI(title="roll gateway", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)

    @app.exception_handler(GatewayError)
    def _error(_: Request, exc: GatewayError) -> JSONResponse:
        return JSONResponse(
            {"error": {"message": exc.message, "type": "invalid_request_error", "code": exc.code}},
            status_code=exc.status,
        )

    def admin(authorization: str | None) -> None:
        if (authorization or "").removeprefix("Bearer ").strip() != gateway.admin_key:
            raise GatewayError(401, "this route needs the gateway's admin key", "invalid_api_key")

    @app.post("/v1/chat/completions")
    def chat(body: dict = Body(...), authorization: str | None = Header(None)) -> dict:
        return gateway.complete(gateway.session_of(authorization), body)

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
            int(body.get("max_tokens", gateway.sampling.max_new_tokens)), body.get("tool_parser", "hermes")
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
