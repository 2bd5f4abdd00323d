//go:build linux

package reliability

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// missingPID returns a PID no process has.
func missingPID(t *testing.T) int {
	t.Helper()
	for pid := 4_000_000; pid > 100_000; pid -= 7919 {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); os.IsNotExist(err) {
			return pid
		}
	}
	t.Fatal("found no unused PID")
	return 0
}

// stutters reports an error line that repeats a wrapping phrase ("opening X:
// opening X: ..."), which reads as a bug to the person who gets it.
func stutters(line string) bool {
	parts := strings.Split(strings.ReplaceAll(line, `"`, ""), ": ")
	for i := 1; i < len(parts); i++ {
		if parts[i] == parts[i-1] {
			return true
		}
	}
	return false
}

// TestBadInput runs gymtrace with each kind of bad input: it must exit
// non-zero (2 for a bad command line or config file) with one
// `gymtrace: ...` line that says what is wrong and what to write instead,
// and never a panic or stack trace.
func TestBadInput(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	badYAML := write("bad.yaml", "gymtrace:\n  span_groups: [server\n  x: : :\n")
	unknownKey := write("unknown.yaml", "gymtrace:\n  no_such_setting: 1\n")
	badGroupYAML := write("badgroup.yaml", "telemetry:\n  span_groups: nosuch\n")
	cfgDir := filepath.Join(dir, "a-directory")
	os.Mkdir(cfgDir, 0o755)
	// A config file only its owner (nobody) may read, read by gymtrace run
	// as nobody: unreadable in the way a permission mistake makes it.
	secretCfg := write("private.yaml", "gymtrace:\n  span_groups: server\n")
	os.Chmod(secretCfg, 0o600)
	srv := startServer(t)
	live := strconv.Itoa(srv.Pid())
	gone := strconv.Itoa(missingPID(t))
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()

	for _, tc := range []struct {
		name string
		args []string
		env  []string
		code int    // 0: any non-zero
		want string // in the error line (case-insensitive)
		user int    // run as this uid (0: as is)
	}{
		{"unknown flag", []string{"--bogus"}, nil, 2, "-bogus", 0},
		{"unknown command", []string{"frobnicate"}, nil, 2, "unknown command", 0},
		{"unknown group", []string{"--span-groups", "nosuch"}, nil, 2, "valid options", 0},
		{"unknown group in env", nil, []string{"GYMTRACE_SPAN_GROUPS=nosuch"}, 2, "nosuch", 0},
		{"unknown group in config", []string{"--config", badGroupYAML}, nil, 2, "nosuch", 0},
		{"empty group list item", []string{"groups", "server,,verify,"}, nil, 0, "", 0}, // accepted or refused, never a crash
		{"unknown group via groups", []string{"groups", "server,nosuch"}, nil, 2, "valid options", 0},
		{"non-numeric pid", []string{"--pid", "abc"}, nil, 2, "--pid 1234", 0},
		{"pid 0", []string{"--pid", "0"}, nil, 2, "--pid 1234", 0},
		{"negative pid", []string{"--pid", "-5"}, nil, 2, "--pid 1234", 0},
		{"huge pid", []string{"--pid", "99999999999999999999"}, nil, 2, "pid", 0},
		{"missing process", []string{"--pid", gone}, nil, 2, "does not exist", 0},
		{"bad role", []string{"--pid", live + "=wizard"}, nil, 2, "valid roles", 0},
		{"missing config", []string{"--config", filepath.Join(dir, "nope.yaml")}, nil, 2, "readable yaml file", 0},
		{"config is a directory", []string{"--config", cfgDir}, nil, 2, "readable yaml file", 0},
		{"unreadable config", []string{"--config", secretCfg}, nil, 2, "permission denied", 65534},
		{"invalid yaml", []string{"--config", badYAML}, nil, 2, "not valid yaml", 0},
		{"unknown config key", []string{"--config", unknownKey}, nil, 2, "known settings", 0},
		{"ringbuf not a power of two", []string{"--ringbuf-bytes", "1000"}, nil, 2, "power of two", 0},
		{"ringbuf not a number", []string{"--ringbuf-bytes", "lots"}, nil, 2, "8MiB", 0},
		{"ringbuf too big", []string{"--ringbuf-bytes", "4GiB"}, nil, 2, "1GiB", 0},
		{"malformed endpoint", []string{"--otlp-endpoint", "http://[::1"}, nil, 2, "http://host:4317", 0},
		{"otlp without endpoint", []string{"--exporter", "otlp"}, nil, 2, "--otlp-endpoint", 0},
		{"unknown exporter", []string{"--exporter", "kafka"}, nil, 2, "jsonl", 0},
		{"bad timeout", []string{"--otlp-timeout", "-1s"}, nil, 2, "10s", 0},
		{"bad sample ratio", []string{"--sample-ratio", "2"}, nil, 2, "0 to 1", 0},
		{"bad log level", []string{"--log-level", "loud"}, nil, 2, "debug, info", 0},
		{"unwritable output", []string{"--pid", live, "--exporter", "jsonl", "--output", "/proc/nonexistent/spans.jsonl"}, nil, 0, "--output", 0},
		{"bad metrics port", []string{"--pid", live, "--metrics-addr", "127.0.0.1:99999"}, nil, 0, "--metrics-addr", 0},
		{"metrics port in use", []string{"--pid", live, "--metrics-addr", busy.Addr().String()}, nil, 0, "--metrics-addr", 0},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			args := tc.args
			if !hasFlag(args, "--exporter") {
				args = append(append([]string{}, args...), "--exporter", "jsonl", "--output", os.DevNull)
			}
			if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
				args = tc.args // a command: frobnicate, groups
			}
			bin := gymtraceBin
			if tc.user != 0 {
				// Test directories are root-only: give the other user a
				// binary it can run.
				d, err := os.MkdirTemp("", "gymtrace-nobody-")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { os.RemoveAll(d) })
				os.Chmod(d, 0o755)
				bin = filepath.Join(d, "gymtrace")
				copyFile(t, gymtraceBin, bin)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, args...)
			cmd.Env = append(cleanEnv(), tc.env...)
			if tc.user != 0 {
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(tc.user), Gid: uint32(tc.user)}}
			}
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			start := time.Now()
			err := cmd.Run()
			if ctx.Err() != nil {
				t.Fatalf("gymtrace %s ran for 30s instead of refusing; stderr:\n%s", strings.Join(args, " "), tail(stderr.String(), 2048))
			}
			code := cmd.ProcessState.ExitCode()
			checkNoPanic(t, "gymtrace", stderr.String())
			if tc.want == "" && code == 0 {
				return
			}
			if code == 0 || err == nil {
				t.Fatalf("gymtrace %s exited 0; stderr:\n%s", strings.Join(args, " "), stderr.String())
			}
			if tc.code != 0 && code != tc.code {
				t.Errorf("exit code %d, want %d", code, tc.code)
			}
			line := lastErrorLine(stderr.String())
			if line == "" {
				t.Fatalf("want exactly one `gymtrace: ...` error line on stderr, got:\n%s", stderr.String())
			}
			if tc.want != "" && !strings.Contains(strings.ToLower(line), strings.ToLower(tc.want)) {
				t.Errorf("error line lacks %q: %s", tc.want, line)
			}
			if stutters(line) {
				t.Errorf("error line repeats itself: %s", line)
			}
			if strings.Contains(stderr.String(), "gymtrace: attached") {
				t.Errorf("gymtrace attached before refusing")
			}
			t.Logf("exit %d in %v: %s", code, time.Since(start).Round(time.Millisecond), line)
		})
	}
}

// cleanEnv is the test's environment without gymtrace's and OTel's
// variables (an empty one still counts as set).
func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GYMTRACE_") && !strings.HasPrefix(kv, "OTEL_") {
			out = append(out, kv)
		}
	}
	return out
}

func hasFlag(args []string, f string) bool {
	for _, a := range args {
		if a == f || strings.HasPrefix(a, f+"=") {
			return true
		}
	}
	return false
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestUnreachableCollector: an OTLP endpoint nobody listens on is not a
// reason to stop tracing (the collector may come up later): gymtrace
// attaches, logs the failed export with the reason, counts the spans it
// could not send, and exits 0 on SIGTERM.
func TestUnreachableCollector(t *testing.T) {
	needRoot(t)
	srv := startServer(t)
	port := freePort(t) // closed again: nothing listens there
	g := startGymtrace(t, gtOpts{pids: []int{srv.Pid()}, otlp: fmt.Sprintf("http://127.0.0.1:%d", port)})
	for i := range 20 {
		get(t, srv.url(fmt.Sprintf("/unreachable-%d", i)))
	}
	line := g.WaitOutput(t, true, "exporting spans failed", 15*time.Second)
	if !strings.Contains(line, "connection refused") {
		t.Errorf("the export failure does not say why: %s", line)
	}
	if g.Exited() {
		t.Fatalf("gymtrace exited with the collector unreachable: %v", g.Err)
	}
	m := g.metrics(t)
	queued := m["gymtrace_export_queue_length"]
	g.terminate(t)
	st := g.WaitOutput(t, true, "gymtrace: detached", time.Second)
	if !strings.Contains(st, "spans_failed=") || strings.Contains(st, "spans_failed=0 ") {
		t.Errorf("spans that could not be sent are not counted as failed: %s", st)
	}
	t.Logf("unreachable collector: %v spans queued while it was down; %s", queued, st[strings.Index(st, "msg="):])
}
