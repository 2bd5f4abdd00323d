//go:build linux

package http

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/gymtrace/gymtrace/internal/loader"
)

// TestWriteFuzzSeeds regenerates testdata/fuzz/FuzzDecode when
// GYMTRACE_WRITE_SEEDS=1 (after a contract change); otherwise it only checks
// that the committed seeds still have the record's size.
func TestWriteFuzzSeeds(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzDecode")
	seeds := map[string][]byte{}
	req := sampleEvent()
	seeds["request"] = Encode(req)
	resp := *req
	resp.Kind, resp.Status, resp.Flags = loader.EvResponse, 200, loader.FlagChunked
	seeds["response"] = Encode(&resp)
	rw := resp
	rw.Flags = loader.FlagReward
	copy(rw.Reward[:], "-1.5e-3")
	seeds["reward"] = Encode(&rw)[:loader.HTTPEventRewardSize]
	cl := *req
	cl.Kind, cl.Flags = loader.EvClose, loader.FlagConnError
	seeds["close"] = Encode(&cl)
	bad := *req
	bad.PathLen = 0xffff
	seeds["path-too-long"] = Encode(&bad)
	seeds["short"] = Encode(req)[:loader.HTTPEventSize/2]
	if os.Getenv("GYMTRACE_WRITE_SEEDS") != "1" {
		for name, want := range seeds {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				t.Fatalf("reading seed %s: %v (run with GYMTRACE_WRITE_SEEDS=1 to regenerate)", name, err)
			}
			if len(b) < len(want) {
				t.Errorf("seed %s looks stale; regenerate with GYMTRACE_WRITE_SEEDS=1", name)
			}
		}
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range seeds {
		data := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
