package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gymtrace/gymtrace/internal/config"
	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/test/testproc"
)

// cli runs gymtrace in-process with a clean environment plus env.
func cli(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = runCLI(context.Background(), args, &out, &errb, func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	})
	return code, out.String(), errb.String()
}

func lines(s string) []string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func TestGroupsCommand(t *testing.T) {
	cases := map[string]string{
		"Default, sandbox":           "http_client job rollout sandbox server",
		"per_rollout":                "agent http_client model_call rollout server verify",
		"all":                        "agent checkpoint http_client job model_call optimizer rollout sandbox server startup step verify",
		"startup,server,http_client": "http_client server startup",
		"server,http_client,verify":  "http_client server verify",
	}
	for spec, want := range cases {
		code, out, errOut := cli(t, nil, "groups", spec)
		if code != 0 || strings.Join(lines(out), " ") != want {
			t.Errorf("groups %q: exit %d, stdout %q, stderr %q; want %q", spec, code, out, errOut, want)
		}
		if errOut != "" {
			t.Errorf("groups %q: unexpected stderr %q", spec, errOut)
		}
	}
	if code, out, _ := cli(t, nil, "groups", "all"); code != 0 || len(lines(out)) != 12 {
		t.Errorf("all: %d lines", len(lines(out)))
	}
	// The default preset is Gym's page's; Gym's newer default adds startup,
	// and the command says so (on stderr: stdout stays one group a line).
	code, out, errOut := cli(t, nil, "groups", "default")
	if code != 0 || strings.Join(lines(out), " ") != "http_client job rollout server" ||
		!strings.Contains(errOut, "adds startup to its default preset") {
		t.Errorf("default: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestGroupsUnknown(t *testing.T) {
	code, out, errOut := cli(t, nil, "groups", "defualt")
	if code != 2 || out != "" {
		t.Fatalf("exit %d stdout %q", code, out)
	}
	want := `gymtrace: unknown span group or preset "defualt"; valid options: agent, all, checkpoint, default, http_client, job, model_call, optimizer, per_rollout, rollout, sandbox, server, startup, step, verify` + "\n"
	if errOut != want {
		t.Errorf("stderr\n got %q\nwant %q", errOut, want)
	}
}

func TestGroupsFromConfig(t *testing.T) {
	// Without SPEC: what run would select, from env or file.
	if code, out, _ := cli(t, nil, "groups"); code != 0 || strings.Join(lines(out), " ") != "http_client job rollout server" {
		t.Errorf("default: %d %q", code, out)
	}
	if _, out, _ := cli(t, map[string]string{"GYMTRACE_SPAN_GROUPS": "verify,server,http_client"}, "groups"); strings.Join(lines(out), " ") != "http_client server verify" {
		t.Errorf("env: %q", out)
	}
	p := filepath.Join(t.TempDir(), "gym.yaml")
	os.WriteFile(p, []byte("telemetry:\n  enabled: true\n  span_groups: per_rollout\n"), 0o644)
	if code, out, errOut := cli(t, nil, "groups", "--config", p); code != 0 || len(lines(out)) != 6 {
		t.Errorf("file: %d %q %q", code, out, errOut)
	}
	// An empty selection prints nothing and warns that traces will not join.
	code, out, errOut := cli(t, map[string]string{"GYMTRACE_SPAN_GROUPS": ""}, "groups")
	if code != 0 || out != "" || !strings.Contains(errOut, "traces will not join across processes") {
		t.Errorf("empty: %d %q %q", code, out, errOut)
	}
	if n := len(lines(errOut)); n != 1 {
		t.Errorf("join warning is %d lines", n)
	}
}

func TestJoinWarningOnGroups(t *testing.T) {
	_, out, errOut := cli(t, nil, "groups", "server,verify")
	if out != "server\nverify\n" || !strings.Contains(errOut, "without http_client") {
		t.Errorf("%q %q", out, errOut)
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"run", "--help"}} {
		code, out, _ := cli(t, nil, args...)
		if code != 0 {
			t.Errorf("%v: exit %d", args, code)
		}
		for _, want := range []string{"per_rollout", "gym.model.chat_completions", "PRESET", "--span-groups", "GYMTRACE_SPAN_GROUPS",
			"two halves of trace joining", "gymtrace groups", "--otlp-endpoint"} {
			if !strings.Contains(out, want) {
				t.Errorf("%v: help lacks %q", args, want)
			}
		}
	}
}

func TestVersion(t *testing.T) {
	code, out, _ := cli(t, nil, "version")
	if code != 0 || !strings.HasPrefix(out, "gymtrace ") || len(lines(out)) != 1 {
		t.Errorf("%d %q", code, out)
	}
}

func TestUsageErrors(t *testing.T) {
	cases := []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, []string{"frobnicate"}, `unknown command "frobnicate"`},
		{nil, []string{"--span-groups", "defualt"}, `"defualt"`},
		{nil, []string{"--no-such"}, "no-such"},
		{nil, []string{"--pid", "12=agentz"}, `unknown role "agentz"`},
		{map[string]string{"GYMTRACE_SAMPLE_RATIO": "7"}, nil, "GYMTRACE_SAMPLE_RATIO"},
		{nil, []string{"--config", "/nonexistent.yaml"}, "reading config file"},
		{nil, []string{"run", "stray"}, "takes no arguments"},
		{nil, []string{"demo", "--exporter", "otlp"}, "needs an endpoint"},
	}
	for _, c := range cases {
		code, out, errOut := cli(t, c.env, c.args...)
		if code != 2 || out != "" {
			t.Errorf("%v: exit %d stdout %q", c.args, code, out)
		}
		if !strings.HasPrefix(errOut, "gymtrace: ") || !strings.Contains(errOut, c.want) || len(lines(errOut)) != 1 {
			t.Errorf("%v: stderr %q, want one gymtrace: line with %q", c.args, errOut, c.want)
		}
	}
}

func TestRunExitCodes(t *testing.T) {
	// A --pid that names no process is the user's input: exit 2 with a final
	// one-line gymtrace: error (without privileges it fails earlier, exit 1).
	// The deadline bounds a tracer that runs.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	code := runCLI(ctx, []string{"run", "--pid", "999999999", "--exporter", "jsonl", "--output", filepath.Join(t.TempDir(), "x")},
		&out, &errb, func(string) (string, bool) { return "", false })
	switch code {
	case 0:
		t.Logf("run ended cleanly at the deadline")
	case 1, 2:
		if os.Geteuid() == 0 && code != 2 {
			t.Errorf("as root, a missing --pid process should exit 2, got %d: %q", code, errb.String())
		}
		l := lines(errb.String())
		if !strings.HasPrefix(l[len(l)-1], "gymtrace: ") {
			t.Errorf("last stderr line is not a gymtrace: error: %q", errb.String())
		}
	default:
		t.Errorf("exit %d: %q", code, errb.String())
	}
}

func TestOneLine(t *testing.T) {
	if got := oneLine(errString("loading objects:\nverifier said\n  line 2\n")); got != "loading objects: | verifier said | line 2" {
		t.Errorf("%q", got)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

func TestWatchReloads(t *testing.T) {
	p := filepath.Join(t.TempDir(), "g.yaml")
	os.WriteFile(p, []byte("gymtrace:\n  span_groups: default\n"), 0o644)
	loader := &config.Loader{Args: []string{"--config", p}, LookupEnv: func(string) (string, bool) { return "", false }}
	if _, err := loader.Load(); err != nil {
		t.Fatal(err)
	}
	var logs testproc.Buffer // safe to read while the watcher writes
	log := slog.New(slog.NewTextHandler(&logs, nil))
	uninstall := installReloadHook(loader, new(slog.LevelVar))
	defer uninstall()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got atomic.Uint64
	done := make(chan struct{})
	go func() {
		watchReloads(ctx, log, func(c *config.Config) error { got.Store(uint64(c.Mask)); return nil })
		close(done)
	}()

	os.WriteFile(p, []byte("gymtrace:\n  span_groups: per_rollout\n"), 0o644)
	// A real SIGHUP to ourselves: it must reach the hook, not kill the test.
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	waitFor(t, func() bool { return groups.Mask(got.Load()) == groups.PerRolloutMask })

	// A broken file is logged and the running config stays.
	os.WriteFile(p, []byte("gymtrace:\n  span_groups: bogus\n"), 0o644)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	waitFor(t, func() bool { return strings.Contains(logs.String(), "config not reloaded") })
	if groups.Mask(got.Load()) != groups.PerRolloutMask {
		t.Error("a failed reload replaced the config")
	}
	cancel()
	<-done
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met in 30 s")
}
