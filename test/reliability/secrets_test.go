//go:build linux

package reliability

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The HTTP paths (headers, query, bodies, Set-Cookie) into the jsonl exporter
// are test/e2e's TestSecrets. This test adds what that one does not reach:
// a sandbox CLI's argv (the gym.sandbox.* lifecycle probe reads argv in the
// kernel), the OTLP exporter's output as a collector receives it, Gym's
// Python servers, and two gymtrace instances side by side (OTLP and jsonl).
const stackSecret = "SECRET-7f3a9c"

// stackReady is the part of launch.py's ready line this test uses.
type stackReady struct {
	Event   string `json:"event"`
	Error   string `json:"error"`
	Servers map[string]struct {
		PID int    `json:"pid"`
		URL string `json:"url"`
	} `json:"servers"`
}

func TestSecretsSandboxArgvAndOTLP(t *testing.T) {
	needRoot(t)
	if out, err := exec.Command(python, "-c", "import fastapi, uvicorn, aiohttp").CombinedOutput(); err != nil {
		t.Skipf("needs %s with fastapi, uvicorn and aiohttp: %v %s", python, err, out)
	}
	fakeSrc := filepath.Join(repoRoot, "test", "fakes", "sandboxcli")
	if _, err := os.Stat(fakeSrc); err != nil {
		t.Skipf("the sandbox argv path needs the compiled fake CLI in test/fakes/sandboxcli: %v", err)
	}
	fakeDir := t.TempDir()
	build := exec.Command(goTool(), "build", "-o", filepath.Join(fakeDir, "docker"), "./test/fakes/sandboxcli")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the fake docker: %v\n%s", err, out)
	}

	st := startProc(t, "stack", []string{python, filepath.Join(repoRoot, "test", "stack", "launch.py"),
		"--serve", "--path-prepend", fakeDir})
	line := st.WaitOutput(t, false, `"event"`, 60*time.Second)
	var ready stackReady
	if err := json.Unmarshal([]byte(line), &ready); err != nil || ready.Event != "ready" {
		t.Fatalf("the stack did not start: %v %s", err, line)
	}
	res, agent, model := ready.Servers["resources"], ready.Servers["agent"], ready.Servers["model"]
	pids := fmt.Sprintf("%d=resources,%d=agent,%d=model", res.PID, agent.PID, model.PID)

	sk := startSink(t)
	gOTLP := startGymtrace(t, gtOpts{groups: "all", otlp: sk.endpoint, extra: []string{"--pid", pids, "--log-level", "debug"}})
	gJSON := startGymtrace(t, gtOpts{groups: "all", extra: []string{"--pid", pids, "--log-level", "debug"}})

	c := &http.Client{Timeout: 10 * time.Second}
	do := func(method, url, body string) {
		t.Helper()
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+stackSecret)
		req.Header.Set("Proxy-Authorization", "Basic "+stackSecret)
		req.Header.Set("Cookie", "session="+stackSecret+"; theme=dark")
		req.Header.Set("X-Api-Key", stackSecret)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s %s: %s %s", method, url, resp.Status, b)
		}
	}
	// Sandbox CLIs whose argv holds the secret: `docker run -d --name
	// box-SECRET ...` and `docker exec box-SECRET sh -c 'echo SECRET'`.
	for _, verb := range []string{"start", "exec"} {
		do("POST", res.URL+"/run_sandbox?token="+stackSecret,
			fmt.Sprintf(`{"provider": "docker", "verb": %q, "name": "box-%s", "cmd": "echo %s"}`, verb, stackSecret, stackSecret))
	}
	for _, s := range []struct{ url, path string }{{agent.URL, "/"}, {model.URL, "/"}, {res.URL, "/"}} {
		do("GET", s.url+s.path+"?api_key="+stackSecret, "")
	}

	// The paths were traced (or this test proves nothing).
	waitSpan(t, sk.out, 30*time.Second, "gym.sandbox.exec from the fake docker (OTLP)",
		func(s span) bool { return strings.HasPrefix(s.Name, "gym.sandbox.") })
	waitSpan(t, sk.out, 30*time.Second, "for POST /run_sandbox (OTLP)",
		func(s span) bool { return s.Kind == "SERVER" && s.path() == "/run_sandbox" })
	waitSpan(t, gJSON.jsonl, 30*time.Second, "gym.sandbox.* (jsonl)", func(s span) bool { return strings.HasPrefix(s.Name, "gym.sandbox.") })
	gOTLP.terminate(t)
	gJSON.terminate(t)

	places := map[string][]byte{
		"the OTLP collector's received spans": mustRead(t, sk.out),
		"the jsonl export":                    mustRead(t, gJSON.jsonl),
		"gymtrace (OTLP) stdout":              []byte(gOTLP.Stdout.String()),
		"gymtrace (OTLP) stderr (debug)":      []byte(gOTLP.Stderr.String()),
		"gymtrace (jsonl) stdout":             []byte(gJSON.Stdout.String()),
		"gymtrace (jsonl) stderr (debug)":     []byte(gJSON.Stderr.String()),
	}
	sandboxSpans := 0
	for _, s := range readSpans(t, sk.out) {
		if strings.HasPrefix(s.Name, "gym.sandbox.") {
			sandboxSpans++
		}
	}
	for where, b := range places {
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(make([]byte, 1<<20), 1<<22)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "SECRET") {
				t.Errorf("the secret reached %s: %s", where, tail(sc.Text(), 600))
			}
		}
	}
	t.Logf("secret sent in Authorization, Proxy-Authorization, Cookie, X-Api-Key, query strings, JSON bodies and sandbox argv (%d gym.sandbox.* spans); searched %d places",
		sandboxSpans, len(places))
}

func mustRead(t *testing.T, f string) []byte {
	t.Helper()
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
