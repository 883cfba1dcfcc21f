"""``python -m serve plain --manifest runs/index`` runs the API without Ray (uvicorn, in-process model and
index; the benchmark's baseline). For the Ray Serve app use ``serve run serve/serve_config.yaml``."""

from __future__ import annotations

import argparse

from serve.config import ServeSettings, settings_from_dict


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m serve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    plain = sub.add_parser("plain", help="uvicorn + FastAPI over an in-process model and index (no Ray)")
    plain.add_argument("--config", help="settings YAML (serve/config.py ServeSettings fields)")
    plain.add_argument("--manifest", help="index manifest (overrides the config)")
    plain.add_argument("--model-dir", help="model directory (default: the manifest's)")
    plain.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    plain.add_argument("--port", type=int, default=None)
    plain.add_argument("--nprobe", type=int, default=None)
    plain.add_argument("--threads", type=int, default=None, help="torch and faiss threads")
    args = parser.parse_args(argv)
    overrides = {"manifest_path": args.manifest, "model_dir": args.model_dir, "host": args.host,
                 "port": args.port, "search": {"nprobe": args.nprobe} if args.nprobe else None,
                 "torch_threads": args.threads}
    data = {k: v for k, v in overrides.items() if v is not None}
    if args.config:
        data["config"] = args.config
    settings: ServeSettings = settings_from_dict(data)
    import uvicorn

    from serve.api import plain_app

    uvicorn.run(plain_app(settings), host=settings.host, port=settings.port, log_level="warning",
                access_log=False)


if __name__ == "__main__":
    main()
