"""`superfluid sessions prune`: one retention pass on a running server (service/retention.py)
through its admin route, POST /v1/sessions/prune."""

from __future__ import annotations

import argparse
import os
import sys

import httpx

from ..api import listener
from ..config import DEFAULT_PORT


def add_parser(sub) -> None:
    se = sub.add_parser("sessions", help="the session store of a running server")
    se_sub = se.add_subparsers(dest="sessions_command", required=True)
    pr = se_sub.add_parser("prune", help="erase idle sessions now, least recently written first (never a live "
                                         "or pinned one): those older than --older-than, or until the store is "
                                         "under --max-mb; neither: the server's own policy")
    pr.add_argument("--older-than", type=float, metavar="DAYS", help="erase sessions last written more than DAYS ago")
    pr.add_argument("--max-mb", type=float, metavar="MB", help="erase until the store's pages hold at most MB")
    pr.add_argument("--port", type=int, default=DEFAULT_PORT)
    pr.add_argument("--api-key", default=os.environ.get("SUPERFLUID_API_KEY"),
                    help="an admin key, if the server has keys")


def run(args: argparse.Namespace) -> int:
    body: dict = {}
    if args.older_than is not None:
        body["older_than_days"] = args.older_than
    if args.max_mb is not None:
        body["max_mb"] = args.max_mb
    url = f"http://127.0.0.1:{args.port}/v1/sessions/prune"
    try:  # the key goes only to this user's own server (api/listener.py)
        listener.check(args.port)
    except listener.NotOurs as e:
        print(f"superfluid: {e}; the key was not sent", file=sys.stderr)
        return 1
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        r = httpx.post(url, json=body, headers=headers, timeout=600)
    except httpx.HTTPError as e:
        print(f"superfluid: no server answers at {url} ({e})", file=sys.stderr)
        return 1
    if r.status_code != 200:
        try:
            why = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            why = r.text[:200]
        print(f"superfluid: {r.status_code}: {why}", file=sys.stderr)
        return 1
    print(f"erased {r.json()['erased']} session(s)")
    return 0
