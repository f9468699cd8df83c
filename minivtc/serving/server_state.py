"""What every route of the server shares: the engine loop, the tokenizer, the model's names,
the keys, the limits and each client's requests in flight.

Owns: `ServerState`, one value made by `server.make_app` and read by every route
(`server.py`, `info_routes.py`) from `app.state.minivtc`. A module of its own so that the
routes in other files can name its type without importing the app that holds it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from minivtc.model.tokenizer import Tokenizer
from minivtc.serving.api_keys import Auth
from minivtc.serving.connections import InFlight, Limits
from minivtc.serving.engine_loop import EngineLoop
from minivtc.serving.prompts import PromptLimits

__all__ = ["ServerState"]


@dataclass
class ServerState:
    loop: EngineLoop
    tokenizer: Tokenizer
    model_name: str
    created: int
    auth: Auth
    prompt_limits: PromptLimits  # how much one request may hold
    limits: Limits  # what one connection may cost (uvicorn's settings are made from it)
    in_flight: InFlight  # each client's requests queued or running, against its limit
    aliases: tuple[str, ...] = ()  # the model's other names (vLLM's --served-model-name)
    chat_template: str | None = None  # a Jinja chat template (None: Llama-2's format)
    # Where a chat template renders: workers of its own, apart from those that parse bodies
    renders: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(2, thread_name_prefix="minivtc-template")
    )

    @property
    def names(self) -> tuple[str, ...]:
        return (self.model_name, *self.aliases)
