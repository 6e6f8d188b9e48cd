"""`verispec serve`: the sockets, the model, the session and uvicorn around the app of
verispec/server.py, and a clean exit on SIGTERM/SIGINT."""

from __future__ import annotations

import sys

from .errors import UsageError, VerispecError
from .server import create_app     # (needs fastapi: the CLI turns an ImportError into a hint)


def build_server(a):
    """The uvicorn.Server for `verispec serve` arguments (tests run it in a thread)."""
    import uvicorn

    from .cli import _model_dir
    from .config import DraftSettings
    from .engine import load_engine
    from .session import Session

    if a.port < 0 or a.port > 65535:
        raise UsageError(f"--port must be 0..65535, got {a.port}")
    if a.queue < 0:
        raise UsageError(f"--queue must be >= 0, got {a.queue}")
    if a.pin_slots < 0:
        raise UsageError(f"--pin-slots must be >= 0, got {a.pin_slots}")
    if a.mtp_vocab < 0:
        raise UsageError(f"--mtp-vocab must be >= 0 (0 = whole vocabulary), got {a.mtp_vocab}")
    if a.threads is not None:
        if a.threads < 1:
            raise UsageError(f"--threads must be >= 1, got {a.threads}")
        import torch
        torch.set_num_threads(a.threads)
    drafts = DraftSettings(lookup=a.lookup, lookup_drafts=a.lookup_drafts, mtp=a.mtp, mtp_drafts=a.mtp_drafts,
                           mtp_pstep=a.mtp_pstep, mtp_vocab=a.mtp_vocab, gate=a.gate)
    model_dir = _model_dir(a.model)
    eng = load_engine(model_dir, read_mtp=a.mtp != "off", usage_file=a.vocab_usage, device=a.device)
    if a.threads is None:
        from . import cpu_threads
        cpu_threads.apply_default(eng)
    if a.mtp == "on" and not eng.has_mtp:
        raise UsageError(f"--mtp on: {eng.path} has no MTP head (mtp.* tensors)")
    limit = eng.args.max_position_embeddings
    if a.context is not None and not 2 <= a.context <= limit:
        raise UsageError(f"--context must be 2..{limit} (the model's max_position_embeddings), got {a.context}")
    context = a.context if a.context is not None else min(limit, 4096)
    session = Session(eng, drafts, context=context, pin_slots=a.pin_slots, prefill_batch=a.prefill_batch)
    app = create_app(session, a.model_name or model_dir.resolve().name, eng.tokenizer, queue_size=a.queue,
                     save_usage=a.usage_save)
    config = uvicorn.Config(app, host=a.host, port=a.port, log_level="warning", access_log=False,
                            timeout_keep_alive=5, lifespan="on")
    return uvicorn.Server(config)


def _listen(host: str, port: int) -> list:
    """The server's sockets, bound before the model loads (a port in use is one clear line): one for
    each address the host resolves to, as uvicorn would bind them (localhost: ::1 and 127.0.0.1)."""
    import socket

    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be 0..65535, got {port}")
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UsageError(f"--host {host}: {e.strerror}") from None
    addrs = list(dict.fromkeys((fam, addr) for fam, _, _, _, addr in found))
    if port == 0:
        addrs = addrs[:1]     # one ephemeral port, not one per address
    socks = []
    try:
        for fam, addr in addrs:
            sock = socket.socket(fam, socket.SOCK_STREAM)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if fam == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
            sock.listen(2048)     # now, not when uvicorn starts: a second server on this port fails here
    except OSError as e:
        for sock in socks:
            sock.close()
        raise VerispecError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    return socks


def serve(a) -> int:
    """Run until SIGTERM/SIGINT: stop accepting, finish the open requests, save the counts, exit 0."""
    import signal

    socks = _listen(a.host, a.port)
    try:
        server = build_server(a)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    host = f"[{a.host}]" if ":" in a.host else a.host
    print(f"[verispec] listening on http://{host}:{socks[0].getsockname()[1]}", file=sys.stderr, flush=True)
    # uvicorn re-raises the signal it caught once it has shut down; with this handler in place
    # that re-raise is a no-op and the process exits 0 after a clean shutdown.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    server.run(sockets=socks)
    return 0 if server.started else 1
