"""The Python API's engine inside Pyodide (a PyScript page): pyshim's JavaScript engine, driven
through Pyodide's FFI.

In a page, the model lives in the site's IndexedDB store and runs in the engine's own Worker (web/pyshim.js
`createEngine`: Python, WebGPU and the weights, off the page's thread). This module hands pyshim.api's
already-validated requests to that engine and turns its OpenAI-shaped replies back into what the API
builds its objects from, so a PyScript page gets exactly the CPython API: same validation, same shapes.

This is a separate module from pyshim/gpu/browser.py (the WebGPU device face, which drives `navigator.gpu`
itself): here Python drives no GPU at all, only the JavaScript engine. The two are the only modules that
import `js`/`pyodide` (a test checks it); this one is imported only by pyshim.api and only in Pyodide.
JavaScript errors become PyshimErrors here, at the boundary.

Finding web/pyshim.js: a PyScript page names it in its config,
    {"js_modules": {"main": {"../pyshim.js": "pyshim_js"}}}
or the caller passes `js_module` (the imported module object, or its URL).
"""

from __future__ import annotations

import json
import js  # type: ignore[import-not-found]
from pyodide.code import run_js  # type: ignore[import-not-found]
from pyodide.ffi import JsException, create_proxy, to_js  # type: ignore[import-not-found]

from pyshim.errors import BadRequestError, ModelNotFoundError, PyshimError, RemoteError, SetupError
from pyshim.serve.wire import Chunks, Reply, reply_of, request_body

JS_MODULE_NAME = "pyshim_js"   # the name under PyScript's js_modules.main
HTTP_BAD_REQUEST = 400


def _js(obj):
    return to_js(obj, dict_converter=js.Object.fromEntries)


def _py(obj) -> dict:
    """An OpenAI object from JS as plain Python data (JSON round trip: small, and no proxies to leak)."""
    return json.loads(js.JSON.stringify(obj))


def _error(exc: JsException) -> PyshimError:
    """A JS error as a PyshimError: the engine's APIError (status, OpenAI's body, hint) keeps its message."""
    status = getattr(exc, "status", None)
    body = getattr(exc, "body", None)
    message, code = str(getattr(exc, "message", exc)), None
    if body is not None:
        error = _py(body).get("error", {})
        message, code = error.get("message", message), error.get("code")
    hint = getattr(exc, "hint", None) or None
    hint = str(hint) if hint is not None else None
    if status == HTTP_BAD_REQUEST:
        return BadRequestError(message, hint=hint)
    if code in ("RemoteError", "CORSError"):       # a remote engine's server (web/engine/remote.js)
        return RemoteError(message, hint=hint)
    if code == "model_not_found":
        return ModelNotFoundError(message, hint=hint)
    return PyshimError(f"{getattr(exc, 'name', 'Error')}: {message}", hint=hint)


async def _module(js_module):
    if js_module is None:
        try:
            from pyscript import js_modules  # type: ignore[import-not-found]

            return getattr(js_modules, JS_MODULE_NAME)
        except (ImportError, AttributeError):
            raise SetupError("pyshim's JavaScript engine (web/pyshim.js) is not loaded in this page",
                             hint='name it in the PyScript config: {"js_modules": {"main": {"<site>/pyshim.js": "pyshim_js"}}}, '
                                  "or pass js_module=<its URL>") from None
    if isinstance(js_module, str):
        url = js.URL.new(js_module, js.document.baseURI).href
        try:
            return await run_js("(url) => import(url)")(url)
        except JsException as exc:
            raise SetupError(f"could not import {url}: {exc}") from None
    return js_module


class JsSession:
    """pyshim.serve.session.Session's `chat` over a JS engine (web/engine/engine.js): the backend pyshim.api
    drives in a PyScript page."""

    def __init__(self, engine, proxies=()):
        self._engine = engine
        self._proxies = proxies   # callbacks the JS engine keeps (onProgress): alive as long as it is

    async def prepare(self) -> None:
        """createEngine has already stored and loaded the model."""

    async def chat(self, messages, sampling, *, on_text=None, should_stop=None) -> Reply:
        """`should_stop` is not polled here: the JS engine's own abort() stops its requests."""
        body = request_body(messages, sampling, stream=on_text is not None)
        try:
            result = await self._engine.chat.completions.create(_js(body))
            if on_text is None:
                return reply_of(_py(result))
            chunks = Chunks(on_text)
            async for chunk_proxy in result:
                chunks.add(_py(chunk_proxy))
            return chunks.reply()
        except JsException as exc:
            raise _error(exc) from None

    def close(self) -> None:
        self._engine.terminate()
        for proxy in self._proxies:
            proxy.destroy()
        self._proxies = ()


async def load_js_session(model: str, settings, *, on_progress=None, js_module=None, base_url=None, api_key=None) -> JsSession:
    """createEngine({model, context, kvType, arithmetic, onProgress}) from web/pyshim.js: the model is
    downloaded into the site's store once (resumable) and loaded onto the GPU in the engine's Worker.
    `settings`: pyshim.plan.settings.RunSettings; `on_progress(dict)` receives the engine's progress
    events ({phase, fraction, …}). `base_url` (and `api_key`): the model is an OpenAI-compatible server's,
    reached by the page's fetch (createEngine({baseURL}): web/engine/remote.js); no download, no GPU."""
    module = await _module(js_module)
    if base_url is not None:
        try:
            return JsSession(await module.createEngine(_js({"model": model, "baseURL": base_url, "apiKey": api_key})))
        except JsException as exc:
            raise _error(exc) from None
    options = {"model": model, "kvType": settings.kv_type}
    if settings.context is not None:
        options["context"] = settings.context
    if settings.arithmetic is not None:
        options["arithmetic"] = settings.arithmetic.value
    if settings.expert_slots is not None:
        options["expertSlots"] = settings.expert_slots
    if settings.streamed_layers is not None:
        options["streamedLayers"] = settings.streamed_layers
    rope = {k: v for k, v in (("scaling", settings.rope_scaling), ("scale", settings.rope_scale),
                              ("yarnOrigCtx", settings.yarn_orig_ctx)) if v is not None}
    if rope:
        options["rope"] = rope
    progress = create_proxy(lambda p: on_progress(_py(p))) if on_progress is not None else None
    if progress is not None:
        options["onProgress"] = progress
    try:
        engine = await module.createEngine(_js(options))
    except JsException as exc:
        if progress is not None:
            progress.destroy()
        raise _error(exc) from None
    return JsSession(engine, (progress,) if progress is not None else ())
