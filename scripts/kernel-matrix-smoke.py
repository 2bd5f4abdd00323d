#!/usr/bin/python3
"""The small servers scripts/kernel-matrix-guest traces beside the test stack.

    kernel-matrix-smoke.py plain|fork|tls PORTFILE [CERT KEY]

plain: a threading HTTP server (capture; the span-groups gate).
fork:  a forking HTTP server: each request is read and answered by a child
       the server forks after accept(), so its spans need the kernel's fork
       tracepoint (the lifecycle programs) to trace the child as its parent.
tls:   a threading HTTPS server (Python's ssl module on the system's libssl):
       its spans need the OpenSSL uprobes.

Every path answers 200 with a short body. The bound port (127.0.0.1, a free
one) is written to PORTFILE once the server listens.
"""

import http.server
import os
import socketserver
import ssl
import sys


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class ForkingHTTPServer(socketserver.ForkingMixIn, http.server.HTTPServer):
    pass


def main():
    mode, portfile = sys.argv[1], sys.argv[2]
    cls = ForkingHTTPServer if mode == "fork" else http.server.ThreadingHTTPServer
    srv = cls(("127.0.0.1", 0), Handler)
    if mode == "tls":
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(sys.argv[3], sys.argv[4])
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    elif mode not in ("plain", "fork"):
        sys.exit(f"unknown mode {mode}: plain, fork or tls")
    tmp = portfile + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{srv.server_address[1]}\n")
    os.rename(tmp, portfile)
    srv.serve_forever()


if __name__ == "__main__":
    main()
