"""A debugging aid of the test stack: how uvicorn's httptools protocol was
handed each request (stacklib.serve installs it with GYMTRACE_TEST_LOG_READS=1)."""

import sys
import time


def install():
    """GYMTRACE_TEST_LOG_READS=1 (httptools): one stderr line per chunk
    uvicorn's protocol is handed (its length, where the header block ends in
    it) and per header block completed, for how a request was read; cheaper
    than strace, whose slowdown hid what it was asked to show (docs/kernels.md,
    "Two nodes in a guest")."""
    from uvicorn.protocols.http import httptools_impl

    proto = httptools_impl.HttpToolsProtocol
    received, headers = proto.data_received, proto.on_headers_complete

    def data_received(self, data):
        end = data.find(b"\r\n\r\n")
        print(f"gt-read {time.time():.6f} {self.client} len={len(data)} head_end={end} first={data[:12]!r}",
              file=sys.stderr, flush=True)
        return received(self, data)

    def on_headers_complete(self):
        print(f"gt-headers {time.time():.6f} {self.client}", file=sys.stderr, flush=True)
        return headers(self)

    proto.data_received, proto.on_headers_complete = data_received, on_headers_complete
