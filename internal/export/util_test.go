package export

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/gymtrace/gymtrace/test/testproc"
)

type syncBuffer = testproc.Buffer

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimSpace(p)))
	return len(p), nil
}

func testLogger(t *testing.T) *slog.Logger { return slog.New(slog.NewTextHandler(testWriter{t}, nil)) }
