package main

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The OTLP/HTTP receiver (--http-listen): POST /v1/traces and /v1/metrics,
// bodies in binary protobuf (application/x-protobuf, what the OTel SDKs'
// http/protobuf exporters send) or OTLP/JSON (application/json), optionally
// gzip-compressed. Each request goes through the same Export methods as the
// gRPC services, so --out, --metrics-out, --count-only, --fail-for and
// --delay mean the same on both listeners; answers are the export response
// in the request's encoding, 503 while --fail-for holds (retryable for
// OTLP/HTTP exporters), 400 for a body that does not decode.

const (
	httpMaxBody   = 64 << 20 // as the gRPC listener
	ctProtobuf    = "application/x-protobuf"
	ctJSON        = "application/json"
	httpTracePath = "/v1/traces"
	httpMetricPth = "/v1/metrics"
)

// httpReceiver serves OTLP/HTTP for one sink.
type httpReceiver struct {
	s   *sink
	lis net.Listener
	srv *http.Server
}

func newHTTPReceiver(s *sink, listen string) (*httpReceiver, error) {
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("listening for OTLP/HTTP on %s (use --http-listen HOST:PORT, port 0 for any free port): %w", listen, err)
	}
	h := &httpReceiver{s: s, lis: lis}
	mux := http.NewServeMux()
	mux.HandleFunc(httpTracePath, h.traces)
	mux.HandleFunc(httpMetricPth, h.metrics)
	h.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return h, nil
}

func (h *httpReceiver) serve() error {
	if err := h.srv.Serve(h.lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving OTLP/HTTP: %w", err)
	}
	return nil
}

// stop lets in-flight requests finish (so their spans reach the file), for
// at most 3 s as the gRPC listener.
func (h *httpReceiver) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := h.srv.Shutdown(ctx); err != nil {
		h.srv.Close()
	}
}

// body reads a request body: POST only, protobuf or JSON, gzip or not.
// It answers the error itself and returns ok=false.
func readOTLPBody(w http.ResponseWriter, r *http.Request) (body []byte, isJSON, ok bool) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "otlpsink: OTLP/HTTP takes POST", http.StatusMethodNotAllowed)
		return nil, false, false
	}
	ct, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch {
	case err == nil && ct == ctProtobuf:
	case err == nil && ct == ctJSON:
		isJSON = true
	default:
		http.Error(w, fmt.Sprintf("otlpsink: Content-Type %q: want %s or %s", r.Header.Get("Content-Type"), ctProtobuf, ctJSON),
			http.StatusUnsupportedMediaType)
		return nil, false, false
	}
	var rd io.Reader = http.MaxBytesReader(w, r.Body, httpMaxBody)
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(rd)
		if err != nil {
			http.Error(w, "otlpsink: bad gzip body: "+err.Error(), http.StatusBadRequest)
			return nil, false, false
		}
		defer zr.Close()
		rd = io.LimitReader(zr, httpMaxBody+1)
	default:
		http.Error(w, fmt.Sprintf("otlpsink: Content-Encoding %q: want gzip or none", enc), http.StatusUnsupportedMediaType)
		return nil, false, false
	}
	body, err = io.ReadAll(rd)
	if err == nil && len(body) > httpMaxBody {
		err = fmt.Errorf("body over %d bytes", httpMaxBody)
	}
	if err != nil {
		http.Error(w, "otlpsink: reading the body: "+err.Error(), http.StatusBadRequest)
		return nil, false, false
	}
	return body, isJSON, true
}

// answer writes an export response, or the HTTP form of an Export error.
func answer(w http.ResponseWriter, isJSON bool, marshal func() ([]byte, error), err error) {
	if err != nil {
		code := http.StatusInternalServerError
		switch status.Code(err) {
		case codes.Unavailable:
			code = http.StatusServiceUnavailable
		case codes.Canceled, codes.DeadlineExceeded:
			code = http.StatusGatewayTimeout
		}
		http.Error(w, status.Convert(err).Message(), code)
		return
	}
	b, merr := marshal()
	if merr != nil {
		http.Error(w, "otlpsink: encoding the response: "+merr.Error(), http.StatusInternalServerError)
		return
	}
	ct := ctProtobuf
	if isJSON {
		ct = ctJSON
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

func (h *httpReceiver) traces(w http.ResponseWriter, r *http.Request) {
	body, isJSON, ok := readOTLPBody(w, r)
	if !ok {
		return
	}
	req := ptraceotlp.NewExportRequest()
	var err error
	if isJSON {
		err = req.UnmarshalJSON(body)
	} else {
		err = req.UnmarshalProto(body)
	}
	if err != nil {
		http.Error(w, "otlpsink: not an ExportTraceServiceRequest: "+err.Error(), http.StatusBadRequest)
		return
	}
	resp, err := h.s.Export(r.Context(), req)
	answer(w, isJSON, func() ([]byte, error) {
		if isJSON {
			return resp.MarshalJSON()
		}
		return resp.MarshalProto()
	}, err)
}

func (h *httpReceiver) metrics(w http.ResponseWriter, r *http.Request) {
	body, isJSON, ok := readOTLPBody(w, r)
	if !ok {
		return
	}
	req := pmetricotlp.NewExportRequest()
	var err error
	if isJSON {
		err = req.UnmarshalJSON(body)
	} else {
		err = req.UnmarshalProto(body)
	}
	if err != nil {
		http.Error(w, "otlpsink: not an ExportMetricsServiceRequest: "+err.Error(), http.StatusBadRequest)
		return
	}
	resp, err := (&metricsService{s: h.s}).Export(r.Context(), req)
	answer(w, isJSON, func() ([]byte, error) {
		if isJSON {
			return resp.MarshalJSON()
		}
		return resp.MarshalProto()
	}, err)
}
