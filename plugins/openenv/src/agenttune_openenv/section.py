"""The `openenv:` config section: where the run's OpenEnv server comes from, and how text maps to actions."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TextOptions(BaseModel):
    """The `openenv.text:` section: how the text workflow maps replies to actions and observations to text."""

    model_config = ConfigDict(extra="forbid")

    action_field: str | None = Field(default=None, description="Action field that receives the model's reply. "
                                                               "Default: the action schema's only string field.")
    observation_field: str | None = Field(default=None, description="Observation field shown to the model. "
                                                                    "Default: its only text field, else JSON.")
    system_prompt: str | None = Field(default=None, description="A system message before the first observation.")


class OpenEnvSection(BaseModel):
    """The `openenv:` config section: which OpenEnv server a run uses, and how to start it."""

    model_config = ConfigDict(extra="forbid")

    app: str | None = Field(
        default=None, description="ASGI app of the environment server, `module:attribute` (e.g. "
                                  "echo_env.server.app:app); agenttune serves it with uvicorn on loopback.")
    command: str | list[str] | None = Field(
        default=None, description="Command that starts the server instead of `app`; `{port}` in it is replaced "
                                  "by `port` (a string is split like a shell would; no shell runs).")
    url: str | None = Field(
        default=None, description="Base URL of a server that already runs (no `app` or `command`), or where "
                                  "`command` serves. Default with `app`: http://127.0.0.1:{port}.")
    image: str | None = Field(default=None, description="A Docker image of the environment (e.g. an OpenEnv "
                                                        "image from a registry): `docker run` publishes its "
                                                        "`image_port` on `port` of loopback.")
    image_port: int = Field(default=8000, ge=1, le=65535,
                            description="The port the image's server listens on inside the container (OpenEnv's: 8000).")
    port: int | None = Field(default=None, ge=1, le=65535,
                             description="Port for `app`/`command`/`image`; default: a free one.")
    cwd: str | None = Field(default=None, description="Working directory of the server (its imports resolve there).")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables for the server.")
    healthcheck_timeout: float = Field(default=120.0, gt=0,
                                       description="Seconds to wait for GET {url}/health to answer 200.")
    stop_timeout: float = Field(default=10.0, gt=0,
                                description="Seconds between SIGTERM and SIGKILL when stopping the server.")
    max_restarts: int = Field(default=3, ge=0, description="How often a server that died during the run is "
                                                           "started again.")
    text: TextOptions = Field(default_factory=TextOptions,
                              description="How agenttune_openenv:TextEnvWorkflow talks to a text environment.")

    @model_validator(mode="after")
    def _one_source(self) -> OpenEnvSection:
        given = [name for name in ("app", "command", "image") if getattr(self, name)]
        if len(given) > 1:
            raise ValueError(f"give one of openenv.app, openenv.command and openenv.image, not {' and '.join(given)}")
        return self

    @property
    def configured(self) -> bool:
        return bool(self.app or self.command or self.url or self.image)
