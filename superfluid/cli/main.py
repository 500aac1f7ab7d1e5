"""`superfluid` command line. User mistakes end with one clear line and a non-zero exit."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

from .. import __version__
from ..config import DEFAULT_HOST, DEFAULT_PORT, ServeConfig
from ..monitor.logs import setup_logging
from ..net.loopback import is_loopback_host
from ..api.policy import KeyPolicy, PolicyError, load_policies
from .llama_flags import add_flags as add_llama_flags, apply_flags as apply_llama_flags
from ..engine import sampling_defaults
from ..errors import ModelLoadError, SuperfluidError
from ..request import Qos
from . import hub as hub_cli, launch as launch_cli, sessions as sessions_cli
from .engine_config import engine_config as _engine_config
from .flags import _class_lanes, _engine_flags, _hostport, _hostports, _positive, _proportions, _qos, _rpc_nodes  # noqa: F401


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="superfluid", description="One serving daemon for local LLMs.")
    p.add_argument("--version", action="version", version=f"superfluid {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve a model over HTTP (default: the embedded SmolLM2-135M-Instruct)")
    s.add_argument("model", nargs="?", help="a .gguf file, a Hugging Face folder, or a Hugging Face name, pulled into the cache first (OWNER/REPO[:QUANT|:FILE], e.g. Qwen/Qwen3-4B-GGUF:Q4_K_M); default: the embedded model")
    s.add_argument("--model", action="append", default=[], dest="models", metavar="PATH|NAME", help="another model to serve, by path or Hugging Face name (repeatable; the first model given is the default)")
    hub_cli.offline_flag(s)
    s.add_argument("--embedding-model", metavar="PATH|default", help="also serve an embedding model, the one /v1/embeddings, /api/embed and /v1/rerank use when a request names none: a sentence-transformers or cross-encoder folder, a GGUF, or 'default' (the embedded all-MiniLM-L6-v2)")
    s.add_argument("--model-dir", metavar="DIR", help="serve every .gguf in DIR too, each loaded on its first request")
    s.add_argument("--idle-timeout", type=float, metavar="S", help="unload a model (never the default) after S idle seconds")
    s.add_argument("--host", default=DEFAULT_HOST, help=f"listen address (default {DEFAULT_HOST})")
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"listen port (default {DEFAULT_PORT})")
    s.add_argument("--http", type=_hostport, metavar="HOST:PORT", help="listen address and port in one")
    _engine_flags(s)
    s.add_argument("--default-qos", type=_qos, default=Qos.AGENT, help="QoS class of requests without x-superfluid-qos: interactive, completion, agent (default) or background")
    s.add_argument("--api-key", default=os.environ.get("SUPERFLUID_API_KEY"), help="require this key (Authorization: Bearer or x-api-key) on every route but /health (default: $SUPERFLUID_API_KEY)")
    s.add_argument("--key-policy", metavar="FILE", help="JSON file of named keys with QoS class, best class allowed, requests per minute, max concurrent requests, admin flag")
    s.add_argument("--rate-limit", type=_positive, metavar="RPM", help="requests per minute per client address")
    s.add_argument("--allow-model-paths", action="store_true", help="let an admin key load any model file by its path (POST /v1/models/load); without it only --model and --model-dir models load")
    s.add_argument("--cache-isolation", choices=("key", "none"), default="key",
                   help="key (default): with API keys, each key reuses only its own cached prompt prefixes, so "
                        "no key learns another's prompts from cached_tokens or timing; none: one cache for all")
    s.add_argument("--cors-origins", metavar="LIST", default="", help="browser origins (comma-separated, e.g. https://app.example) allowed besides pages on this machine, which always are; without it, a server with API keys lets any page ask")
    s.add_argument("--no-tui", action="store_true", help="plain logs even on a terminal (the live monitor is shown only when stdout is a terminal)")
    s.add_argument("--no-ui", action="store_true", help="do not serve the web app (the chat at / and the engine view at /monitor)")
    s.add_argument("--log-format", choices=("text", "json"), default="text", help="log lines as text (default) or one JSON object per line")
    s.add_argument("--max-body", type=_positive, default=16 * 1024 * 1024, help="largest request body in bytes (default 16 MiB)")
    s.add_argument("--max-connections", type=_positive, default=1024, metavar="N", help="open HTTP connections at most; more get a 503 and are closed (default 1024)")
    s.add_argument("--header-timeout", type=_positive, default=30, metavar="S", help="seconds a connection gets to send a request's headers before it is closed (default 30)")
    s.add_argument("--sessions", metavar="DIR", help="session store directory (default: $SUPERFLUID_HOME/sessions, ~/.superfluid/sessions)")
    s.add_argument("--sessions-cache", action="store_true", help="keep sessions in memory only: nothing survives a restart")
    s.add_argument("--resume-grace", type=float, default=0.0, metavar="S", help="a streamed generation whose client disconnected is cut at once, freeing its lane, and a resume with Last-Event-ID continues it from the log (default 0); S > 0 keeps it running S seconds instead")
    s.add_argument("--sessions-max-mb", type=float, metavar="MB", help="the session store's cap: idle sessions are erased, least recently written first, once it is 90%% full (down to 75%%); when only live or pinned ones are left, writes get HTTP 507 store_full")
    s.add_argument("--sessions-max-age", type=float, metavar="DAYS", help="erase sessions idle for more than DAYS (never a live or pinned one)")
    s.add_argument("--fleet", type=_hostports, default=(), metavar="HOST:PORT,...", help="fleet nodes to dial: the default model runs on them (this head keeps the tokenizer, template and session log)")
    s.add_argument("--fleet-listen", type=_hostport, metavar="HOST:PORT", help="accept fleet nodes that join (superfluid node join HOST:PORT)")
    s.add_argument("--fleet-auth", metavar="TOKENFILE", help="the fleet token file (superfluid fleet token); without one, nodes must be on loopback")
    s.add_argument("--fleet-policy", choices=("load-aware", "least-loaded", "round-robin"), default="load-aware", help="how sessions are placed on nodes (default load-aware)")
    s.add_argument("--fleet-timeout", type=float, default=5.0, metavar="S", help="a node silent for S seconds is gone (default 5)")
    s.add_argument("--fleet-grace", type=float, default=1.0, metavar="S", help="a gone node's generations move to another node after S seconds (default 1)")
    s.add_argument("--pipeline", type=_hostports, default=(), metavar="HOST:PORT,...", help="run the model split by layers over these stage nodes (superfluid node serve --stage), in layer order; needs superfluid[hf] on the stages")
    s.add_argument("--pipeline-spares", type=_hostports, default=(), metavar="HOST:PORT,...", help="stage nodes that take the place of a lost stage; requests running on the pipeline then continue after a re-prefill")
    s.add_argument("--rpc-nodes", type=_rpc_nodes, default=((), ()), metavar="HOST:PORT|NAME|auto,...", help="split the GGUF by layers over this host's CPU and these llama.cpp RPC nodes, over Link F (weights stay quantized): HOST:PORT is dialed (superfluid node serve --rpc); NAME is the node that joins under that --name, auto every node that joins (superfluid node join --rpc; needs --fleet-listen)")
    s.add_argument("--rpc-split", type=_proportions, default=(), metavar="P,P,...", help="the layers' proportions: this host first, then each --rpc-nodes node (default: by each one's free memory)")
    s.add_argument("--rpc-output", choices=("head", "last"), default="head", help="where a split model's output layer goes: head (this host's CPU, beside the input embedding: the last node sends back a hidden state, not logits) or last (the last node, llama.cpp's placement: less memory on this host)")
    s.add_argument("--pipeline-split", choices=("even", "memory"), default="even", help="how the stages share the layers: evenly (default) or in proportion to the memory each reports")
    s.add_argument("--fleet-local", action="store_true", help="this head also serves its default model as one of the fleet's nodes")
    s.add_argument("--no-mdns", action="store_true", help="do not advertise --fleet-listen on mDNS (_superfluid-fleet._tcp)")
    s.add_argument("--drain-timeout", type=float, default=300.0, help="on SIGUSR1 (superfluid stop --drain): seconds running requests get to finish (default 300)")
    add_llama_flags(s)
    sampling_defaults.add_flags(s)
    fl = sub.add_parser("fleet", help="fleet tools")
    fl_sub = fl.add_subparsers(dest="fleet_command", required=True)
    fl_sub.add_parser("token", help="create <home>/fleet/token (mode 0600) unless it exists, and print it")
    nd = sub.add_parser("node", help="run a fleet node")
    nd_sub = nd.add_subparsers(dest="node_command", required=True)
    ns = nd_sub.add_parser("serve", help="serve a model to a fleet head over Link F (the head dials this node)")
    ns.add_argument("model", nargs="?", help="path to a .gguf file (default: the embedded model)")
    ns.add_argument("--model", dest="model_opt", metavar="PATH", help="the same, as an option")
    ns.add_argument("--listen", type=_hostport, default=("127.0.0.1", 8454), metavar="HOST:PORT", help="where heads dial in (default 127.0.0.1:8454)")
    ns.add_argument("--auth-file", metavar="TOKENFILE", help="the fleet token file; required to listen off loopback")
    ns.add_argument("--stage", action="store_true", help="serve as a pipeline stage: hold the layers a head assigns (superfluid serve --pipeline), on transformers (needs superfluid[hf])")
    ns.add_argument("--rpc", action="store_true", help="offer this host's CPU and memory to heads that split a GGUF (superfluid serve --rpc-nodes), through llama.cpp's RPC engine inside Link F")
    ns.add_argument("--lease", type=float, default=10.0, metavar="S", help="a head silent for S seconds loses its generations here (default 10)")
    ns.add_argument("--name", help="this node's name in the fleet (default: the host name); a node that joins again under its name gets its generations back")
    _engine_flags(ns)
    hub_cli.offline_flag(ns)
    nj = nd_sub.add_parser("join", help="serve a model to a fleet head by dialing it (the head needs --fleet-listen)")
    nj.add_argument("head", nargs="?", metavar="HOST:PORT", help="the head's --fleet-listen address (default: find a head with this fleet token by mDNS)")
    nj.add_argument("model", nargs="?", help="path to a .gguf file (default: the embedded model)")
    nj.add_argument("--model", dest="model_opt", metavar="PATH", help="the same, as an option")
    nj.add_argument("--token", help="the fleet token (or --auth-file)")
    nj.add_argument("--auth-file", metavar="TOKENFILE", help="a file holding the fleet token")
    nj.add_argument("--lease", type=float, default=10.0, metavar="S", help="a head silent for S seconds loses its generations here (default 10)")
    nj.add_argument("--name", help="this node's name in the fleet (default: the host name); a node that joins again under its name gets its generations back")
    nj.add_argument("--mdns-interface", metavar="IP", help="look for heads by mDNS on the interface with this address only (default: all)")
    nj.add_argument("--rpc", action="store_true", help="offer this host's CPU and memory to the head, which splits a GGUF over the nodes that join (serve --rpc-nodes auto or NAME --fleet-listen), through llama.cpp's RPC engine inside Link F")
    _engine_flags(nj)
    hub_cli.offline_flag(nj)
    launch_cli.add_parsers(sub)
    sessions_cli.add_parser(sub)
    hub_cli.add_parsers(sub)
    t = sub.add_parser("top", help="watch servers: a row each from their /metrics, once a second")
    t.add_argument("servers", nargs="*", metavar="HOST:PORT", help=f"default {DEFAULT_HOST}:{DEFAULT_PORT}")
    t.add_argument("--api-key", default=os.environ.get("SUPERFLUID_API_KEY"))
    t.add_argument("--interval", type=float, default=1.0)
    t.add_argument("--once", action="store_true", help="print one table and exit")
    return p


def _top(args: argparse.Namespace) -> int:
    from ..monitor.top import run as top
    try:
        top(args.servers or [f"{DEFAULT_HOST}:{DEFAULT_PORT}"], api_key=args.api_key,
            interval=args.interval, once=args.once)
    except KeyboardInterrupt:
        pass
    return 0


def _policies(args: argparse.Namespace) -> list:
    out = load_policies(args.key_policy) if args.key_policy else []
    if args.api_key:
        if len(args.api_key) < 8:
            raise PolicyError("--api-key must be at least 8 characters")
        if any(p.key == args.api_key for p in out):
            raise PolicyError("--api-key is also a key in --key-policy")
        out.insert(0, KeyPolicy(name="default", key=args.api_key, admin=True))
    return out


def _serve(args: argparse.Namespace) -> int:
    from ..daemon import build, listen_socket, run, store_of
    from ..runtime.registry import resolve

    problem = apply_llama_flags(args)
    if problem:
        print(f"superfluid: {problem}", file=sys.stderr)
        return 2
    try:
        paths = ([args.model] if args.model else []) + args.models
        sources = [resolve(p) for p in paths] if paths else [resolve(None)]
        embedding = None
        if args.embedding_model:
            from ..runtime.registry import embedded_embedding_model
            esrc = embedded_embedding_model() if args.embedding_model == "default" else resolve(args.embedding_model)
            embedding = esrc.id
            if all(s.id != esrc.id for s in sources):
                sources.append(esrc)
        if args.model_dir and not os.path.isdir(args.model_dir):
            raise ModelLoadError(f"--model-dir {args.model_dir} is not a directory")
    except ModelLoadError as e:
        print(f"superfluid: {e.message}", file=sys.stderr)
        return 2
    src = sources[0]
    host, port = args.http if args.http else (args.host, args.port)
    ec = _engine_config(args, src)
    if isinstance(ec, int):
        return ec
    try:
        policies = _policies(args)
    except PolicyError as e:
        print(f"superfluid: {e}", file=sys.stderr)
        return 2
    if not policies and not is_loopback_host(host):
        print(f"superfluid: warning: listening on {host} without --api-key: anyone who can reach "
              f"port {port} can use this server", file=sys.stderr)
    tui = sys.stdout.isatty() and not args.no_tui and args.log_format == "text"
    cfg = ServeConfig(  # by keyword: a field added to ServeConfig cannot shift the others
        ec, host=host, port=port, max_body_bytes=args.max_body, default_qos=args.default_qos,
        policies=tuple(policies), ip_rpm=args.rate_limit, log_format=args.log_format, tui=tui,
        drain_timeout=args.drain_timeout, models=tuple(sources), model_dir=args.model_dir,
        idle_timeout=args.idle_timeout, sessions_dir=args.sessions, sessions_cache=args.sessions_cache,
        resume_grace=args.resume_grace,
        store_max_bytes=int(args.sessions_max_mb * 1024 * 1024) if args.sessions_max_mb else None,
        fleet=tuple(args.fleet), fleet_policy=args.fleet_policy, fleet_timeout=args.fleet_timeout,
        fleet_grace=args.fleet_grace, fleet_listen=args.fleet_listen, fleet_local=args.fleet_local,
        fleet_mdns=not args.no_mdns, embedding_model=embedding, ui=not args.no_ui,
        cors_origins=tuple(o.strip() for o in args.cors_origins.split(",") if o.strip()),
        allow_model_paths=args.allow_model_paths, aliases=tuple(args.aliases), strict_models=args.strict_models,
        max_connections=args.max_connections, header_timeout=float(args.header_timeout),
        sessions_max_age=args.sessions_max_age * 86400 if args.sessions_max_age else None,
        cache_isolation=args.cache_isolation == "key")
    if args.fleet_local and not (args.fleet or args.fleet_listen):
        print("superfluid: --fleet-local needs --fleet or --fleet-listen (a head with other nodes)", file=sys.stderr)
        return 2
    if args.fleet_listen and args.fleet_auth is None and not is_loopback_host(args.fleet_listen[0]):
        print("superfluid: --fleet-listen off loopback needs --fleet-auth (a fleet token)", file=sys.stderr)
        return 2
    rpc_dialed, rpc_names = args.rpc_nodes
    rpc = bool(rpc_dialed or rpc_names)
    if sum(map(bool, (args.pipeline, args.fleet or (args.fleet_listen and not rpc), rpc))) > 1:
        print("superfluid: --pipeline, --rpc-nodes and --fleet/--fleet-listen are ways to serve the model: pick one",
              file=sys.stderr)
        return 2
    if args.pipeline and (args.rope_scaling or args.rope_scale):
        print("superfluid: --rope-scaling and --rope-scale are not offered on --pipeline stages: serve the "
              "model on one host or split it with --rpc-nodes", file=sys.stderr)
        return 2
    if args.pipeline or rpc:
        from .fleet import read_token, rpc_engine
        flag = "--pipeline stages" if args.pipeline else "--rpc-nodes"
        if args.fleet_auth is None and not all(is_loopback_host(h) for h, _ in
                                               args.pipeline + args.pipeline_spares + rpc_dialed):
            print(f"superfluid: {flag} off loopback need --fleet-auth (a fleet token): the link would be "
                  "plaintext", file=sys.stderr)
            return 2
        try:
            psk = read_token(args.fleet_auth) if args.fleet_auth else None
        except (OSError, ValueError) as e:
            print(f"superfluid: cannot read --fleet-auth: {e}", file=sys.stderr)
            return 2
        if rpc:
            got = rpc_engine(ec, args, psk)
            if isinstance(got, int):
                return got
            cfg = replace(cfg, engine=got, fleet_psk=psk, fleet_listen=None)  # RPC nodes join the worker
        else:
            cfg = replace(cfg, engine=replace(ec, runtime="pipeline", stages=tuple(args.pipeline), stage_psk=psk,
                                              stage_split=args.pipeline_split,
                                              stage_spares=tuple(args.pipeline_spares)))
    if args.fleet or (args.fleet_listen and not rpc):
        from .fleet import read_token
        if args.fleet_auth is None and not all(is_loopback_host(h) for h, _ in args.fleet):
            print("superfluid: --fleet nodes off loopback need --fleet-auth (a fleet token): the link would be "
                  "plaintext", file=sys.stderr)
            return 2
        try:
            cfg = replace(cfg, fleet_psk=read_token(args.fleet_auth) if args.fleet_auth else None)
        except (OSError, ValueError) as e:
            print(f"superfluid: cannot read --fleet-auth: {e}", file=sys.stderr)
            return 2
    try:
        daemon = build(cfg, store=store_of(cfg))
    except ModelLoadError as e:  # --model-dir, --alias
        print(f"superfluid: {e.message}", file=sys.stderr)
        return 2
    except SuperfluidError as e:  # the store is locked by another daemon, or not one we can read
        print(f"superfluid: {e.message}", file=sys.stderr)
        return 1
    try:
        sock = listen_socket(host, port)
    except OSError as e:
        daemon.store.close()
        print(f"superfluid: cannot listen on {host}:{port}: {e.strerror}", file=sys.stderr)
        return 1
    try:
        run(daemon, sock)
    except ModelLoadError as e:
        print(f"superfluid: {e.message}", file=sys.stderr)
        return 2
    except SuperfluidError as e:  # e.g. the worker could not load the model or its KV cache
        print(f"superfluid: {e.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


def _node(args: argparse.Namespace) -> int:
    from .fleet import node_serve
    from ..runtime.registry import resolve
    if getattr(args, "rpc", False) and getattr(args, "stage", False):
        print("superfluid: --rpc and --stage are two kinds of node: pick one", file=sys.stderr)
        return 2
    head = getattr(args, "head", None)
    if head is not None and args.model is None and (head.endswith(".gguf") or os.path.isfile(head)):
        args.model, head = head, None  # `node join MODEL`: the head is found by mDNS
    try:
        src = resolve(args.model or args.model_opt)
    except ModelLoadError as e:
        print(f"superfluid: {e.message}", file=sys.stderr)
        return 2
    ec = _engine_config(args, src)
    if isinstance(ec, int):
        return ec
    if args.node_command == "join":
        from .fleet import node_join
        if head is None:
            return node_join(ec, None, 0, args.token, args.auth_file, args.lease, mdns_interface=args.mdns_interface,
                             name=args.name, rpc=args.rpc)
        try:
            head_host, head_port = _hostport(head)
        except argparse.ArgumentTypeError as e:
            print(f"superfluid: {e}", file=sys.stderr)
            return 2
        return node_join(ec, head_host, head_port, args.token, args.auth_file, args.lease, name=args.name,
                         rpc=args.rpc)
    host, port = args.listen
    return node_serve(ec, host, port, args.auth_file, args.lease, name=args.name, stage=args.stage, rpc=args.rpc)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    agent_args: list[str] = []
    if argv[:1] == ["launch"] and "--" in argv:  # everything after -- belongs to the agent
        i = argv.index("--")
        argv, agent_args = argv[:i], argv[i + 1:]
    args = parser().parse_args(argv)
    if args.command == "launch":
        args.args = list(args.args) + agent_args
    setup_logging(json_lines=getattr(args, "log_format", "text") == "json")
    hub_cli.apply_offline(args)
    if args.command == "serve":
        return _serve(args)
    if args.command == "top":
        return _top(args)
    if args.command == "fleet":
        from .fleet import fleet_token
        return fleet_token()
    if args.command == "node":
        return _node(args)
    if args.command in ("launch", "stop"):
        return launch_cli.run(args)
    if args.command == "sessions":
        return sessions_cli.run(args)
    if args.command in ("pull", "models", "rm"):
        return hub_cli.run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
