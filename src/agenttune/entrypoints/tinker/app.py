"""The HTTP API the `tinker` SDK (0.38) speaks, as Starlette routes over the trainer and the sampler.

Requests are parsed with the SDK's own pydantic types (`tinker.types`), so a body the SDK would not
send is refused the way the SDK would refuse it. Training and sampling requests are queued as
futures (futures.py; sample requests run on the event loop, batched by sampling.py's scheduler);
the handshake, `get_info`, `weights_info` and sampler lookups answer at once.
In front of the routes (`Guard`): the Host/Origin check and the body limit of `agenttune serve`,
the API key, and the content type (JSON, or protobuf for forward_backward). Every refusal has the
SDK's error shape, `{"error": <one sentence>, "category": "user"}`, and a 4xx status.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agenttune.entrypoints.tinker.checkpoints import METADATA, CheckpointStore, iso_time
from agenttune.entrypoints.tinker.futures import Futures, Result, TinkerError
from agenttune.entrypoints.tinker.models import LoraSettings, ModelHost
from agenttune.entrypoints.tinker.sampling import Sampler
from agenttune.entrypoints.tinker.training import Trainer
from agenttune.web import ServerLimits
from agenttune.web.requests import BodyTooLarge, HostCheck, header, read_body

API = "/api/v1"
SNAPSHOT = "snapshot-"  # the name of a sampler checkpoint saved for save_weights_and_get_sampling_client
SNAPSHOTS_KEPT = 8  # per training client; sampling from an older snapshot fails with "no checkpoint"
PROTOBUF = "application/x-protobuf"
# The SDK's feature flags (ClientConfigResponse): plain API keys, uncompressed protobuf, custom losses
# on the client, one retrieve_future per request; what this server implements.
CLIENT_CONFIG = {"pjwt_auth_enabled": False, "credential_default_source": "api_key", "proto_compress_fwdbwd": False,
                 "sample_use_retrieve_futures": False, "custom_loss_server_side": False,
                 "sample_join_sampling_session": False}


@dataclass
class TinkerState:
    """Everything the routes reach: the model, the trainer, the sampler, the futures, the sessions."""

    host: ModelHost
    store: CheckpointStore
    futures: Futures
    trainer: Trainer = field(init=False)
    sampler: Sampler = field(init=False)
    sessions: set[str] = field(default_factory=set)
    batch_record: Path | None = None

    def __post_init__(self) -> None:
        self.trainer = Trainer(self.host, self.store, batch_record=self.batch_record)
        self.sampler = Sampler(self.host, self.store, self.futures)


def error_response(message: str, status: int) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse({"error": message, "category": "user"}, status_code=status)


# -- the handshake ---------------------------------------------------------------------------------------

async def healthz(state: TinkerState, body: Any) -> Any:
    return {"status": "ok"}


async def client_config(state: TinkerState, body: Any) -> Any:
    return CLIENT_CONFIG


async def client_dynamic_config(state: TinkerState, body: Any) -> Any:
    return {"refresh_interval_sec": 300, "sample_cancel_enabled": False}


async def create_session(state: TinkerState, body: Any) -> Any:
    from tinker import types

    _parse(types.CreateSessionRequest, body)
    session_id = uuid.uuid4().hex
    state.sessions.add(session_id)
    return {"type": "create_session", "session_id": session_id}


async def session_heartbeat(state: TinkerState, body: Any) -> Any:
    from tinker import types

    request = _parse(types.SessionHeartbeatRequest, body)
    if request.session_id not in state.sessions:  # 410: the SDK stops heartbeating a session that ended
        raise TinkerError(f"The session {request.session_id} is not open on this server.", 410)
    return {"type": "session_heartbeat"}


async def telemetry(state: TinkerState, body: Any) -> Any:
    return {"status": "accepted"}  # kept nowhere: nothing leaves this machine


async def capabilities(state: TinkerState, body: Any) -> Any:
    return {"supported_models": [{"model_name": state.host.name, "max_context_length": state.host.context_length(),
                                  "trainable": True, "sampleable": True}]}


async def finish_session(state: TinkerState, body: Any, session_id: str) -> Any:
    """The session's training clients are unloaded (their adapters and optimizers free memory); its
    checkpoints stay."""
    state.sessions.discard(session_id)
    prefix = f"{session_id}:train:"

    def unload() -> Result:
        for model_id in [model_id for model_id in state.trainer.runs if model_id.startswith(prefix)]:
            state.trainer.unload(model_id)
        return Result(json={})

    state.futures.submit(unload)  # on the worker: after the session's queued requests, never during one
    return {}


# -- training --------------------------------------------------------------------------------------------

async def create_model(state: TinkerState, body: Any) -> Any:
    from tinker import types

    request = _parse(types.CreateModelRequest, body)
    _check_base_model(state, request.base_model)
    _check_session(state, request.session_id)
    if request.lora_config is None:
        raise TinkerError("Full fine-tuning is not served; pass a lora_config (create_lora_training_client).")
    lora = LoraSettings(**request.lora_config.model_dump(include=set(LoraSettings.__dataclass_fields__)))
    model_id = f"{request.session_id}:train:{request.model_seq_id}"

    def work() -> Result:
        state.trainer.create(model_id, lora)
        return Result(json={"model_id": model_id, "type": "create_model"})

    return _queued(state, work, model_id=model_id)


async def get_info(state: TinkerState, body: Any) -> Any:
    from tinker import types

    request = _parse(types.GetInfoRequest, body)
    run = state.trainer.run(request.model_id)
    return {"type": "get_info", "model_id": run.model_id, "is_lora": True, "lora_rank": run.lora.rank,
            "model_name": state.host.name,
            "model_data": {"arch": getattr(state.host.model.config, "model_type", None),
                           "model_name": state.host.name, "tokenizer_id": state.host.path}}


async def forward_backward(state: TinkerState, body: Any) -> Any:
    from agenttune.entrypoints.tinker.protobuf import write_forward_backward

    request = body  # protobuf.ForwardBackwardRequest, read by the guard
    state.trainer.run(request.model_id)

    def work() -> Result:
        outputs, metrics = state.trainer.forward_backward(request.model_id, request.data, request.loss_fn,
                                                          request.config, forward_only=request.forward_only)
        return Result(proto=write_forward_backward(outputs, metrics))

    return _queued(state, work, model_id=request.model_id)


async def optim_step(state: TinkerState, body: Any) -> Any:
    from tinker import types

    request = _parse(types.OptimStepRequest, body)
    if not isinstance(request.optim_params, types.AdamParams):
        raise TinkerError("Only the Adam optimizer is served (AdamParams).")
    params = request.optim_params.model_dump()
    state.trainer.run(request.model_id)
    return _queued(state, lambda: Result(json={"metrics": state.trainer.optim_step(request.model_id, params)}),
                   model_id=request.model_id)


# -- checkpoints -----------------------------------------------------------------------------------------

async def save_weights(state: TinkerState, body: Any) -> Any:
    from tinker import types

    request = _parse(types.SaveWeightsRequest, body)
    state.trainer.run(request.model_id)
    name = request.path or f"step-{uuid.uuid4().hex[:8]}"

    def work() -> Result:
        checkpoint = state.trainer.save(request.model_id, "weights", name, overwrite=request.overwrite)
        return Result(json={"path": checkpoint.path, "type": "save_weights"})

    return _queued(state, work, model_id=request.model_id)


async def save_weights_for_sampler(state: TinkerState, body: Any) -> Any:
    from tinker import types

    request = _parse(types.SaveWeightsForSamplerRequest, body)
    state.trainer.run(request.model_id)
    if request.kind != "snapshot":
        raise TinkerError("Only snapshot sampling clients are served (kind='snapshot').")
    # No name: save_weights_and_get_sampling_client, which wants a sampling session on a snapshot. Tinker
    # calls those ephemeral: only the newest few are kept on disk (an RL loop makes one a step).
    name = request.path or f"{SNAPSHOT}{time.time_ns()}"

    def work() -> Result:
        checkpoint = state.trainer.save(request.model_id, "sampler_weights", name)
        if request.path is not None:
            return Result(json={"path": checkpoint.path, "type": "save_weights_for_sampler"})
        state.store.prune(request.model_id, "sampler_weights", SNAPSHOT, keep=SNAPSHOTS_KEPT)
        session = state.sampler.open(checkpoint.path)
        return Result(json={"path": checkpoint.path, "sampling_session_id": session.session_id,
                            "type": "save_weights_for_sampler"})

    return _queued(state, work, model_id=request.model_id)


async def load_weights(state: TinkerState, body: Any) -> Any:
    from tinker import types

    request = _parse(types.LoadWeightsRequest, body)
    if request.model_id is not None:  # load_state: into an existing training client
        model_id = request.model_id
        state.trainer.run(model_id)

        def work() -> Result:
            state.trainer.load(model_id, request.path, optimizer=request.optimizer)
            return Result(json={"path": request.path, "model_id": model_id, "type": "load_weights"})
    else:  # create_training_client_from_state: a new training client, created by the load
        if request.session_id is None or request.model_seq_id is None:
            raise TinkerError("load_weights needs a model_id, or a session_id and model_seq_id.")
        _check_session(state, request.session_id)
        if request.base_model is not None:
            _check_base_model(state, request.base_model)
        model_id = f"{request.session_id}:train:{request.model_seq_id}"

        def work() -> Result:
            state.trainer.create_from(model_id, request.path, optimizer=request.optimizer)
            return Result(json={"path": request.path, "model_id": model_id, "type": "load_weights"})

    return _queued(state, work, model_id=model_id)


async def weights_info(state: TinkerState, body: Any) -> Any:
    path = body.get("tinker_path") if isinstance(body, dict) else None
    if not isinstance(path, str):
        raise TinkerError("weights_info needs a tinker_path.")
    metadata = state.store.find(path).metadata()
    lora = metadata["lora"]
    return {"base_model": metadata["base_model"], "is_lora": True, "lora_rank": lora["rank"],
            "train_unembed": lora["train_unembed"], "train_mlp": lora["train_mlp"], "train_attn": lora["train_attn"]}


# -- training runs and their checkpoints (the SDK's RestClient) ------------------------------------------

async def get_training_run(state: TinkerState, body: Any, model_id: str) -> Any:
    return _training_run(state, model_id)


async def list_training_runs(state: TinkerState, body: Any) -> Any:
    """The live training clients and every model id with saved checkpoints (also from before a restart)."""
    model_ids = sorted(set(state.trainer.runs) | {checkpoint.model_id for checkpoint in state.store.saved()})
    limit, offset = _page(body, default_limit=20)
    runs = [_training_run(state, model_id) for model_id in model_ids[offset:offset + limit]]
    return {"training_runs": runs, "cursor": {"offset": offset, "limit": limit, "total_count": len(model_ids)}}


async def list_checkpoints(state: TinkerState, body: Any, model_id: str) -> Any:
    return {"checkpoints": [checkpoint.listing() for checkpoint in state.store.saved(model_id)]}


async def list_user_checkpoints(state: TinkerState, body: Any) -> Any:
    saved = state.store.saved()
    limit, offset = _page(body, default_limit=100)
    return {"checkpoints": [checkpoint.listing() for checkpoint in saved[offset:offset + limit]],
            "cursor": {"offset": offset, "limit": limit, "total_count": len(saved)}}


def _training_run(state: TinkerState, model_id: str) -> dict[str, Any]:
    saved = state.store.saved(model_id)
    live = state.trainer.runs.get(model_id)
    if live is None and not saved:
        raise TinkerError(f"No training run {model_id!r} is known to this server: neither a training client nor "
                          "saved checkpoints.", 404)
    lora = live.lora.as_dict() if live is not None else saved[0].metadata()["lora"]
    last = {kind: next((c.listing() for c in saved if c.kind == kind), None) for kind in ("weights", "sampler_weights")}
    when = live.last_request if live is not None else (saved[0].directory / METADATA).stat().st_mtime
    return {"training_run_id": model_id, "base_model": state.host.name, "model_owner": "local", "is_lora": True,
            "lora_rank": lora["rank"], "corrupted": False,
            "last_request_time": iso_time(when),
            "last_checkpoint": last["weights"], "last_sampler_checkpoint": last["sampler_weights"]}


def _page(query: Any, *, default_limit: int) -> tuple[int, int]:
    """`limit` and `offset` of a listing's query string."""
    try:
        limit, offset = int(query.get("limit", default_limit)), int(query.get("offset", 0))
    except ValueError:
        raise TinkerError("limit and offset must be whole numbers.") from None
    if limit < 1 or offset < 0:
        raise TinkerError("limit must be at least 1 and offset at least 0.")
    return limit, offset


# -- sampling --------------------------------------------------------------------------------------------

async def create_sampling_session(state: TinkerState, body: Any) -> Any:
    from tinker import types

    request = _parse(types.CreateSamplingSessionRequest, body)
    _check_session(state, request.session_id)
    if request.model_path is None:
        _check_base_model(state, request.base_model)
    session = state.sampler.open(request.model_path)
    return {"type": "create_sampling_session", "sampling_session_id": session.session_id}


async def get_sampler(state: TinkerState, body: Any, sampler_id: str) -> Any:
    session = state.sampler.session(sampler_id)
    return {"sampler_id": session.session_id, "base_model": state.host.name, "model_path": session.model_path}


async def delete_checkpoint(state: TinkerState, body: Any, model_id: str, checkpoint_id: str) -> Any:
    from starlette.responses import Response

    state.store.delete(model_id, checkpoint_id)
    return Response(status_code=204)  # the SDK casts the answer to None


async def asample(state: TinkerState, body: Any) -> Any:
    from tinker import types

    from agenttune.entrypoints.tinker.protobuf import write_sample

    request = _parse(types.SampleRequest, body)
    if request.sampling_session_id is not None:
        session_id = request.sampling_session_id
    else:  # an old-style request that names its weights itself
        _check_base_model(state, request.base_model or state.host.name)
        session_id = state.sampler.open(request.model_path).session_id
    state.sampler.session(session_id)
    _refuse_unserved_sampling(request)
    prompt = _prompt_tokens(request.prompt)
    params = request.sampling_params.model_dump()

    async def work() -> Result:  # on the event loop: concurrent requests share the engine's batch
        sampled = await state.sampler.sample(session_id, prompt, request.num_samples, params,
                                             prompt_logprobs=bool(request.prompt_logprobs))
        return Result(proto=write_sample(sampled.sequences, sampled.prompt_logprobs))

    request_id = state.futures.submit_async(work)
    return {"request_id": request_id, "sample_sequence_ids": [f"{request_id}-{i}" for i in range(request.num_samples)]}


# -- futures ---------------------------------------------------------------------------------------------

async def retrieve_future(state: TinkerState, body: Any) -> Any:
    from starlette.responses import JSONResponse, Response
    from tinker import types

    request = _parse(types.FutureRetrieveRequest, body)
    result = await state.futures.wait(request.request_id)
    if result is None:  # the SDK polls again at once on 408
        return JSONResponse({"type": "try_again", "request_id": request.request_id, "queue_state": "active"},
                            status_code=408)
    if result.proto is not None:
        return Response(result.proto, media_type=PROTOBUF)
    return result.json


# -- the app ---------------------------------------------------------------------------------------------

Handler = Callable[..., Awaitable[Any]]
ROUTES: list[tuple[str, str, Handler]] = [
    ("GET", "/healthz", healthz),
    ("POST", "/client/config", client_config),
    ("POST", "/client/dynamic_config", client_dynamic_config),
    ("POST", "/create_session", create_session),
    ("POST", "/session_heartbeat", session_heartbeat),
    ("POST", "/telemetry", telemetry),
    ("GET", "/get_server_capabilities", capabilities),
    ("POST", "/sessions/{session_id}/finish", finish_session),
    ("POST", "/create_model", create_model),
    ("POST", "/get_info", get_info),
    ("POST", "/forward_backward", forward_backward),
    ("POST", "/optim_step", optim_step),
    ("POST", "/save_weights", save_weights),
    ("POST", "/save_weights_for_sampler", save_weights_for_sampler),
    ("POST", "/load_weights", load_weights),
    ("POST", "/weights_info", weights_info),
    ("POST", "/create_sampling_session", create_sampling_session),
    ("GET", "/samplers/{sampler_id}", get_sampler),
    ("POST", "/asample", asample),
    ("GET", "/training_runs", list_training_runs),
    ("GET", "/training_runs/{model_id}", get_training_run),
    ("GET", "/training_runs/{model_id}/checkpoints", list_checkpoints),
    ("GET", "/checkpoints", list_user_checkpoints),
    ("DELETE", "/training_runs/{model_id}/checkpoints/{checkpoint_id:path}", delete_checkpoint),
    ("POST", "/retrieve_future", retrieve_future),
]


def build_app(state: TinkerState, *, api_key: str | None = None, limits: ServerLimits | None = None,
              allowed_hosts: frozenset[str] | None = None) -> Any:
    """The ASGI app. `api_key`: the one key accepted (None: any key starting `tml-`); `allowed_hosts`:
    the Host names answered (None: any, for a server bound beyond loopback)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    routes = [Route(API + path, _endpoint(state, handler), methods=[method]) for method, path, handler in ROUTES]

    async def not_served(request: Any, error: Exception) -> Any:
        status = getattr(error, "status_code", 404)
        if status == 405:
            return error_response(f"{request.method} {request.url.path} is not served; see docs/tinker.md for "
                                  "the routes this server answers.", 405)
        return error_response(f"{request.url.path} is not served by this Tinker-compatible server (yet); see "
                              "docs/tinker.md for the routes it answers.", 404)

    app: Any = Starlette(routes=routes, exception_handlers={HTTPException: not_served})
    app = Guard(app, routes, api_key=api_key, limits=limits or ServerLimits())
    return HostCheck(app, allowed_hosts) if allowed_hosts is not None else app


def _endpoint(state: TinkerState, handler: Handler) -> Callable[[Any], Awaitable[Any]]:
    async def endpoint(request: Any) -> Any:
        from starlette.responses import JSONResponse, Response

        try:
            # a POST's parsed body; a GET's query string (the listings' limit and offset)
            body = dict(request.query_params) if request.method == "GET" else request.scope.get("agenttune.body")
            reply = await handler(state, body, **request.path_params)
        except TinkerError as error:
            return error_response(str(error), error.status)
        return reply if isinstance(reply, Response) else JSONResponse(reply)

    return endpoint


class Guard:
    """ASGI middleware: the API key, the content type and the body limit, before any route runs. The body
    is read here (refused past the limit while it streams in) and handed on parsed, in the scope; a
    request no route takes goes on unread, to be answered 404 or 405."""

    def __init__(self, app: Any, routes: list[Any], *, api_key: str | None, limits: ServerLimits):
        self.app, self.routes, self.api_key, self.limits = app, routes, api_key, limits

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            self._check_key(scope)
            if scope["method"] == "POST" and self._routed(scope):
                scope["agenttune.body"] = await self._body(scope, receive)
        except TinkerError as error:
            return await error_response(str(error), error.status)(scope, receive, send)
        except _ClientLeft:
            return None
        await self.app(scope, receive, send)

    def _check_key(self, scope: dict[str, Any]) -> None:
        key = header(scope, b"x-api-key") or ""
        if self.api_key is not None and key != self.api_key:
            raise TinkerError("The API key is not this server's (set TINKER_API_KEY to the key it was started "
                              "with).", 401)
        if not key.startswith("tml-"):
            raise TinkerError("Send an API key starting with 'tml-' (any such key is accepted here).", 401)

    def _routed(self, scope: dict[str, Any]) -> bool:
        from starlette.routing import Match

        return any(route.matches(scope)[0] == Match.FULL for route in self.routes)

    async def _body(self, scope: dict[str, Any], receive: Any) -> Any:
        media = (header(scope, b"content-type") or "").split(";", 1)[0].strip().lower()
        if media not in ("application/json", PROTOBUF):
            raise TinkerError("Send the body as JSON (Content-Type: application/json), or as protobuf for "
                              "forward_backward.", 415)
        try:
            raw = await read_body(scope, receive, self.limits.max_body_bytes)
        except BodyTooLarge as error:
            raise TinkerError(str(error), 413) from None
        if raw is None:
            raise _ClientLeft
        if media == PROTOBUF:
            from agenttune.entrypoints.tinker.protobuf import read_forward_backward

            return read_forward_backward(raw, header(scope, b"content-encoding"))
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            raise TinkerError("The request body is not valid JSON.") from None


class _ClientLeft(Exception):
    pass


# -- helpers ---------------------------------------------------------------------------------------------

def _parse(model: Any, body: Any) -> Any:
    from pydantic import ValidationError

    try:
        return model.model_validate(body if body is not None else {})
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "body"
        raise TinkerError(f"The request body does not fit {model.__name__}: {where}: {first.get('msg')}.") from None


def _queued(state: TinkerState, work: Callable[[], Result], *, model_id: str) -> dict[str, Any]:
    return {"request_id": state.futures.submit(work), "model_id": model_id}


def _check_base_model(state: TinkerState, base_model: str | None) -> None:
    if base_model != state.host.name:
        raise TinkerError(f"This server serves the base model {state.host.name!r}, not {base_model!r}.")


def _check_session(state: TinkerState, session_id: str) -> None:
    if session_id not in state.sessions:
        raise TinkerError(f"The session {session_id} is not open on this server (sessions end when it stops; "
                          "create a new ServiceClient).", 404)


def _prompt_tokens(prompt: Any) -> list[int]:
    tokens: list[int] = []
    for chunk in prompt.chunks:
        if getattr(chunk, "type", None) != "encoded_text":
            raise TinkerError("Only text prompts (encoded_text chunks) are served; this model takes no images.")
        tokens.extend(int(token) for token in chunk.tokens)
    return tokens


def _refuse_unserved_sampling(request: Any) -> None:
    unserved = [name for name, value in (("topk_prompt_logprobs", request.topk_prompt_logprobs),
                                         ("topk_sample_logprobs", request.topk_sample_logprobs),
                                         ("target_prompt_logprobs", request.target_prompt_logprobs),
                                         ("prompt_alt_tokens_k", request.prompt_alt_tokens_k),
                                         ("prompt_logprobs_last_n", request.prompt_logprobs_last_n)) if value]
    if unserved:
        raise TinkerError(f"Sampling with {', '.join(unserved)} is not served yet.")
