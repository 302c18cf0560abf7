"""The FastAPI app: the site (web/), the WGSL sources (shaders/), models with HTTP Range, and a
listing of the GGUF files on this computer. Nothing here runs a model."""

from __future__ import annotations

import threading
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from pyshim import __version__
from pyshim.paths import MODELS_DIR, WEB_DIR, shaders_dir
from server.discovery import Found, ModelRoots, discover
from server.files import file_response, safe_join
from server.summary import summarize

# Cross-origin isolation (needed for SharedArrayBuffer, i.e. threaded wasm peers); WebGPU works either way.
ISOLATION_HEADERS = {
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
}


def create_app(
    *,
    web_dir: Path = WEB_DIR,
    shader_dir: Path | None = None,
    roots: ModelRoots | None = None,
    isolated: bool = False,
) -> FastAPI:
    shader_dir = shader_dir or shaders_dir()
    roots = roots or ModelRoots.default(MODELS_DIR)
    extra = {"Cross-Origin-Resource-Policy": "same-origin", **(ISOLATION_HEADERS if isolated else {})}
    app = FastAPI(title="pyshim dev server", version=__version__, docs_url=None, redoc_url=None)
    state = {"external": {}}  # id -> Found, for files outside models/ (the allow-list)
    lock = threading.Lock()

    def refresh() -> list[Found]:
        found = discover(roots)
        with lock:
            state["external"] = {f.id: f for f in found if f.source != "models"}
        return found

    def serve(request: Request, path: Path | None) -> Response:
        if path is None:
            return Response(status_code=404, content=b"not found\n", media_type="text/plain", headers=extra)
        return file_response(request, path, extra)

    @app.get("/api/health")
    def health():
        return {"ok": True, "version": __version__, "isolated": isolated}

    @app.get("/api/models")
    def list_models():
        models = []
        for f in refresh():
            entry = {"id": f.id, "name": f.name, "source": f.source, "url": f"/models/{f.id}"}
            entry.update(summarize(f.path))
            models.append(entry)
        return JSONResponse({"models": models}, headers=extra)

    @app.api_route("/models/{rel:path}", methods=["GET", "HEAD"])
    def model_file(rel: str, request: Request):
        path = safe_join(roots.models, rel)
        if path is None:
            with lock:
                known = state["external"].get(rel)
            if known is None and rel.split("/", 1)[0] in ("hf", "ollama", "lmstudio"):
                refresh()
                with lock:
                    known = state["external"].get(rel)
            path = known.path if known is not None and known.path.is_file() else None
        return serve(request, path)

    @app.api_route("/shaders/{rel:path}", methods=["GET", "HEAD"])
    def shader_file(rel: str, request: Request):
        return serve(request, safe_join(shader_dir, rel))

    @app.api_route("/{rel:path}", methods=["GET", "HEAD"])
    def site_file(rel: str, request: Request):
        return serve(request, safe_join(web_dir, rel or "index.html"))

    return app
