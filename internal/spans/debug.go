//go:build linux

package spans

import (
	"os"
	"strconv"

	"go.opentelemetry.io/otel/attribute"

	"github.com/gymtrace/gymtrace/internal/http"
)

// debugRecords (GYMTRACE_DEBUG_RECORDS=1) adds to every HTTP span the kernel
// identities its parent and join were decided from: the connection and
// request index, the asyncio context and root of the request and of the
// response, and the inbound request the kernel bound the call to. For
// finding a wrong parent in a kept test run (docs/python-causality.md); off
// in production, since these are meaningless to a user.
var debugRecords = os.Getenv("GYMTRACE_DEBUG_RECORDS") == "1"

func appendDebug(attrs []attribute.KeyValue, x *http.Exchange) []attribute.KeyValue {
	return append(attrs,
		attribute.Int64("gymtrace.debug.conn", int64(x.ConnID)),
		attribute.Int64("gymtrace.debug.seq", int64(x.Seq)),
		attribute.Int64("gymtrace.debug.tid", int64(x.TID)),
		attribute.String("gymtrace.debug.py_ctx", strconv.FormatUint(x.PyCtx, 16)),
		attribute.String("gymtrace.debug.py_root", strconv.FormatUint(x.PyRoot, 16)),
		attribute.String("gymtrace.debug.resp_py_ctx", strconv.FormatUint(x.RespPyCtx, 16)),
		attribute.String("gymtrace.debug.resp_py_root", strconv.FormatUint(x.RespPyRoot, 16)),
		attribute.Int64("gymtrace.debug.cause_conn", int64(x.CauseConn)),
		attribute.Int64("gymtrace.debug.cause_seq", int64(x.CauseSeq)),
		attribute.Int64("gymtrace.debug.req_start", int64(x.ReqStart)),
		attribute.Bool("gymtrace.debug.gap", x.Gap),
	)
}

// appendSandboxDebug adds to a gym.sandbox.* span the CLI's pid, its kernel
// start and end (CLOCK_MONOTONIC) and the inbound request the kernel bound
// its fork to: a test places the span on its spawn by these, not by wall
// time, which a stepped clock moves.
func appendSandboxDebug(attrs []attribute.KeyValue, sb *sandbox, end uint64) []attribute.KeyValue {
	return append(attrs,
		attribute.Int64("gymtrace.debug.pid", int64(sb.pid)),
		attribute.Int64("gymtrace.debug.start", int64(sb.start)),
		attribute.Int64("gymtrace.debug.end", int64(end)),
		attribute.Int64("gymtrace.debug.cause_conn", int64(sb.cause[0])),
		attribute.Int64("gymtrace.debug.cause_seq", int64(sb.cause[1])),
	)
}
