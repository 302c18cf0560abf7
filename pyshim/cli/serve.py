"""`pyshim serve`: the dev server on 127.0.0.1 (site, shaders, models with HTTP Range)."""

from __future__ import annotations

DEFAULT_PORT = 8000


def add_arguments(parser):
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT}; 0 picks a free one)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1: this computer only)")
    parser.add_argument("--isolated", action="store_true", help="send COOP/COEP headers (cross-origin isolation, for threaded wasm)")
    parser.add_argument("--setup", action="store_true", help="run `pyshim setup` first (what the README's serve command does)")


def run(args) -> int:
    import socket

    import uvicorn

    from pyshim.paths import VENDOR_DIR
    from server.app import create_app

    if args.setup:
        from pyshim.cli import setup

        setup.run(setup.default_args())
    elif not (VENDOR_DIR / "manifest.json").is_file():
        print("pyshim serve: web/vendor is empty — the page cannot boot Python. Run `pyshim setup` first.")

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(128)  # accept connections (queued until uvicorn runs) before announcing the URL
    port = sock.getsockname()[1]
    # The harness reads this line to learn the port when it asked for 0.
    print(f"pyshim serving http://{args.host}:{port}/ (Ctrl+C to stop)", flush=True)
    config = uvicorn.Config(create_app(isolated=args.isolated), log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])
    return 0
