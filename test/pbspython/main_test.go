package main

import (
	"os"
	"path/filepath"
	"testing"
)

// ready: only a finished install of this very version is left alone.
func TestReady(t *testing.T) {
	dir := t.TempDir()
	const v = "v0.0.0-3.14.6-20260610-1"
	if ready(dir, v) {
		t.Fatal("an empty directory is ready")
	}
	bin := filepath.Join(dir, "bin", "python3.14")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, []byte("\x7fELF"), 0o755); err != nil {
		t.Fatal(err)
	}
	if ready(dir, v) {
		t.Fatal("ready without its marker (an interrupted install)")
	}
	if err := os.WriteFile(filepath.Join(dir, marker), []byte(v+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !ready(dir, v) {
		t.Fatal("a finished install is not ready")
	}
	if ready(dir, "v0.0.0-3.14.7-20260701-1") {
		t.Fatal("another version's install is ready")
	}
}
