"""Import shims for Dynamo 1.6.1 in the benchmarks' peer venv: benchmarks/dynamo_peer.py copies this file into
that venv's site-packages as `_dynamo_peer_shims.py`, which a .pth file there imports in every interpreter.
Why each shim is needed: the comment above `SHIM_MODULE` in benchmarks/dynamo_peer.py."""

import importlib.abc
import importlib.util
import math
import os
import sys

QWEN2_VL = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
NIXL = "nixl"
NIXL_PROGRESS_DELAY_ENV = "DYNAMO_PEER_NIXL_PROGRESS_DELAY_US"


def smart_resize(height, width, factor=28, min_pixels=56 * 56, max_pixels=14 * 14 * 4 * 1280):
    """Qwen2-VL's rule: sides divisible by `factor`, pixel count within [min_pixels, max_pixels]."""
    ratio = max(height, width) / min(height, width)
    if ratio > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {ratio}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _after_qwen2_vl(module, error):
    if not hasattr(module, "smart_resize"):
        try:  # the same function in the module that does not need torchvision
            from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as real
        except Exception:  # noqa: BLE001
            real = smart_resize
        module.smart_resize = real


def _after_nixl(module, error):
    if error is not None:
        raise error
    delay = os.environ.get(NIXL_PROGRESS_DELAY_ENV)
    if not delay:
        return
    bindings = module._api.nixlBind
    base = bindings.nixlAgentConfig

    class BoundedProgressConfig(base):
        def __setattr__(self, name, value):
            if name == "pthrDelay":
                value = max(value, int(delay))
            super().__setattr__(name, value)

    bindings.nixlAgentConfig = BoundedProgressConfig


AFTER = {QWEN2_VL: _after_qwen2_vl, NIXL: _after_nixl}


class _Loader(importlib.abc.Loader):
    def __init__(self, real, after):
        self.real = real
        self.after = after

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        error = None
        if self.real is not None:
            try:
                self.real.loader.exec_module(module)
            except Exception as e:  # noqa: BLE001 - each hook decides
                error = e
        self.after(module, error)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        after = AFTER.get(name)
        if after is None:
            return None
        sys.meta_path.remove(self)
        try:
            real = importlib.util.find_spec(name)
        except Exception:  # noqa: BLE001
            real = None
        finally:
            sys.meta_path.insert(0, self)
        if real is None and name == NIXL:
            return None
        origin = real.origin if real is not None else None
        spec = importlib.util.spec_from_loader(name, _Loader(real, after), origin=origin)
        if real is not None:
            spec.submodule_search_locations = real.submodule_search_locations
            spec.has_location = real.has_location
        return spec


if not any(type(f).__name__ == "_Finder" and type(f).__module__ == __name__ for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
