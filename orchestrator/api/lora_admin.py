"""vLLM's adapter calls, `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter`: the same bodies, answers
and status codes as vLLM's server, over the app's `AdapterCatalog` (so every frontend serves the change).
Admin-only (orchestrator/api/app.py)."""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.api.errors import APIError, bad_request, from_validation_error, unavailable
from orchestrator.lora.adapter import LoraAdapter
from orchestrator.lora.catalog import AdapterCatalog, AdapterConflict, AdapterInvalid, AdapterNotFound


class LoadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)
    load_inplace: bool = False


class UnloadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str = Field(min_length=1)
    lora_int_id: int | None = None  # vLLM's field; the name alone decides here


def _body(raw: bytes, model: type[BaseModel]) -> BaseModel:
    try:
        return model.model_validate(json.loads(raw or b"null"))
    except ValueError as e:
        if isinstance(e, ValidationError):
            raise from_validation_error(e) from None
        raise bad_request(f"request body is not valid JSON: {e}") from None


class LoraAdmin:
    def __init__(self, catalog: AdapterCatalog | None) -> None:
        self.catalog = catalog

    def _enabled(self) -> AdapterCatalog:
        if self.catalog is None:
            raise bad_request("LoRA adapters are not enabled on this app: set model.lora in its config", code="lora")
        return self.catalog

    async def load(self, raw_body: bytes) -> str:
        req = _body(raw_body, LoadLoraAdapterRequest)
        assert isinstance(req, LoadLoraAdapterRequest)
        catalog = self._enabled()
        if req.load_inplace:
            raise bad_request("load_inplace is not supported: load changed weights under a new name", "load_inplace")
        # A relative or ~ path would resolve differently on each replica's node.
        if req.lora_path.startswith((".", "~")):
            raise bad_request("lora_path must be an absolute directory or a Hugging Face id", "lora_path")
        try:
            await catalog.load(LoraAdapter(req.lora_name, req.lora_path))
        except (AdapterConflict, AdapterInvalid) as e:
            raise bad_request(str(e), "lora_name" if isinstance(e, AdapterConflict) else "lora_path") from None
        except Exception as e:  # the engine check or the store failed, not the adapter: nothing was loaded
            raise unavailable(f"the adapter could not be checked or stored, nothing was loaded: {e}") from None
        return f"Success: LoRA adapter '{req.lora_name}' added successfully."

    async def unload(self, raw_body: bytes) -> str:
        req = _body(raw_body, UnloadLoraAdapterRequest)
        assert isinstance(req, UnloadLoraAdapterRequest)
        catalog = self._enabled()
        try:
            await catalog.unload(req.lora_name)
        except AdapterNotFound:
            raise APIError(
                404, f"The lora adapter '{req.lora_name}' cannot be found.", type="not_found_error", param="lora_name"
            ) from None
        except AdapterConflict as e:
            raise bad_request(str(e), "lora_name") from None
        return f"Success: LoRA adapter '{req.lora_name}' removed successfully."
